// Package untrusted writes trees that came out of a sandbox onto the host.
//
// Everything a sandbox wrote is hostile: its archive may name paths that
// climb out, plant symlinks for a later entry (or a later copy) to follow,
// carry ACLs and setuid bits, or be mostly holes that expand on disk.
// Extract and ExtractFile write such a tar stream under a destination the
// caller names and promise:
//
//   - Nothing is written outside the destination. Every path component is
//     resolved with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
//     RESOLVE_NO_MAGICLINKS) from a descriptor of the destination, so no
//     symlink is ever followed: not one the archive made, not one already
//     on the host. An entry whose parent is a symlink, or a name with a ".."
//     component, is refused (Invalid). The destination path itself is
//     resolved the same way from "/" (or the working directory): if any of
//     its components is a symlink the call is refused, and the caller passes
//     a resolved path (realpath) instead.
//   - Symlinks are created as links with their target text as-is, never
//     dereferenced, and only when that target cannot lead outside the
//     destination: relative, every ".." first and no more of them than the
//     link's depth (so a grader opening files of the tree stays in it).
//     Other symlinks are refused (Invalid) unless Options.SymlinksAsIs,
//     which keeps them: tools that later open files of such a tree follow
//     them like any symlink.
//   - Hard links only to regular files this same extraction created.
//   - No owners, no ACLs, no extended attributes except names starting with
//     a prefix of Options.XattrAllow (empty by default). Permission bits are
//     masked with 0o755 (setuid, setgid, sticky and group/other write go;
//     directories keep owner rwx so the tree can be removed) unless
//     Options.Preserve. Metadata is applied only to what the extraction
//     created: a directory that already existed keeps its mode.
//   - Device nodes and FIFOs are skipped and counted, never created.
//   - Holes stay holes: all-zero 4 KiB blocks are seeked over and the file
//     is ftruncated to its size, so a 3 GB sparse file costs no disk.
//   - Budgets: at most DefaultMaxBytes of regular-file content (apparent
//     size) and DefaultMaxEntries entries unless the options say otherwise;
//     going over is Exhausted.
//   - All or nothing for what it created: on any error everything the
//     extraction created is removed (pre-existing files stay; a pre-existing
//     file that an entry replaced is not restored). Only the roots of newly
//     created subtrees are remembered, not every path.
//   - Streaming with bounded resources: one archive header and a 256 KiB
//     buffer in memory, and a handful of descriptors whatever the depth
//     (the parent of the last entry is cached; other parents are walked in
//     chunks of at most 2 KiB of path).
//
// Pre-existing non-directories named by an entry are replaced (like cp);
// a pre-existing directory is never replaced by a non-directory (Conflict).
// Modification times of files and symlinks are restored, directories' are
// not. Plain and gzip-compressed tar streams are accepted.
package untrusted
