//go:build ignore

/*
 * The container init stage, in C. internal/agentbin/build.sh compiles it
 * with the agent into the standalone agent binary (no Go build compiles
 * it: see the constraint above), which the backend starts in new mount,
 * pid, uts, ipc and net namespaces with _WARREN_CONTAINER_INIT set; this
 * constructor takes over before main, builds the sandbox's view of the
 * world and becomes the agent (PID 1) in the same process.
 *
 * File descriptors: 3 = config (read until EOF; the daemon writes it only
 * after placing us in our cgroup), 4 = the agent's listening socket (made
 * here at the config's agent_socket; listen_at),
 * 5 = status pipe (a message means failure; our closing it means the
 * sandbox is up), 6 = the standalone agent (what the daemon exec'd; closed),
 * 7 = a network namespace to join, where the config says so (closed).
 *
 * Config: NUL-separated key=value entries: rootfs (mount point); lower
 * (the overlay's lower directories, top-most first, ':'-separated), upper,
 * work and overlay_options (further overlayfs options), mounted here, inside the
 * sandbox's own mount namespace, so the daemon's namespace does not
 * accumulate one mount per sandbox for every later clone to copy;
 * hostname; empty (the node's shared empty read-only tmpfs, used to hide
 * directories); sysfs (the node's shared sysfs); dev (this sandbox's /dev
 * directory, created here, on the node's shared devfs); rlimits (the
 * resource limits of the sandbox's processes: apply_rlimits); cgroups and
 * cgroup_skel (its own cgroup, read-only, at /sys/fs/cgroup:
 * mount_cgroups); views (files of the node's views tmpfs bound over what
 * it reads its CPU count from: bind_views); seccomp (the system-call
 * filter, hex of struct sock_filter entries: internal/seccomp; installed
 * with no_new_privs as the last step, so every process of the sandbox,
 * the agent included, runs under it) and seccomp_audit (the filter that
 * makes the kernel log the deliberate refusals); auid (the audit login
 * uid every process of the sandbox carries: the init's host pid, so that
 * the daemon attributes an audit record to its sandbox even after the
 * process that caused it is gone); no_new_privs ("0": leave it off, so
 * that setuid binaries work); userns ("BASE:SIZE": the user-namespace
 * mode, see make_userns); agent_exe (the agent's file on the node's
 * agent tmpfs: adopt_exe); agent_socket (where the agent listens:
 * listen_at); netns ("7": join the network namespace at fd 7, the clone
 * made none).
 *
 * Nothing the sandbox can read names a host path: the overlay is mounted
 * with data naming only descriptors (lowerdir=/proc/self/fd/N:..., which
 * mountinfo shows as given), and every bind's source is the root of a
 * filesystem or a path inside the sandbox's own /dev.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1U << 1)
#endif

#define INIT_ENV "_WARREN_CONTAINER_INIT"
#define FD_CONFIG 3
#define FD_LISTEN 4
#define FD_STATUS 5
#define CONFIG_MAX (64 << 10)

/* The agent's entry (internal/agent/agent_linux.c): on its own stack in
 * the standalone build, in place in the warren binary. */
void warren_agent_start(int fd) __attribute__((noreturn));
/* The limits the agent sets in each process it starts (agent_linux.c). */
void warren_agent_child_rlimits(const char *spec);
/* Whether the agent leaves PID 1 dumpable (agent_linux.c). */
extern int warren_agent_dumpable;
/* Fields of /proc/self/stat (agent_linux.c). */
int warren_stat_fields(unsigned long *out, const int *which, int count);

/* Capability numbers (kernel ABI; musl ships no linux/capability.h). */
enum {
	CAP_CHOWN = 0, CAP_DAC_OVERRIDE = 1, CAP_FOWNER = 3, CAP_FSETID = 4, CAP_KILL = 5,
	CAP_SETGID = 6, CAP_SETUID = 7, CAP_SETPCAP = 8, CAP_NET_BIND_SERVICE = 10,
	CAP_SYS_CHROOT = 18, CAP_SYS_ADMIN = 21, CAP_AUDIT_WRITE = 29, CAP_SETFCAP = 31,
};
/* capget/capset's arguments, version 3 (64 capabilities in two words). */
#define WARREN_CAP_V3 0x20080522
struct warren_cap_header {
	uint32_t version;
	int pid;
};
struct warren_cap_data {
	uint32_t effective, permitted, inheritable;
};

static void __attribute__((noreturn)) die(const char *step, const char *arg)
{
	char msg[512];
	int e = errno;
	int n = snprintf(msg, sizeof msg, "%s%s%s: %s", step, arg ? " " : "", arg ? arg : "", strerror(e));
	if (n > 0)
		(void)!write(FD_STATUS, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
	_exit(1);
}

/* Page-aligned, so that its pages can be given back once it is parsed. */
static char config[CONFIG_MAX] __attribute__((aligned(4096)));

static const char *conf(const char *key, size_t len)
{
	size_t klen = strlen(key);
	for (size_t i = 0; i < len; i += strlen(config + i) + 1)
		if (!strncmp(config + i, key, klen) && config[i + klen] == '=')
			return config + i + klen + 1;
	return NULL;
}

static void do_mount(const char *src, const char *dst, const char *type, unsigned long flags, const char *data)
{
	if (mount(src, dst, type, flags, data) < 0)
		die("mount", dst);
}

/* The overlay's mount data, at most a page (the kernel copies no more):
 * ~20 bytes per layer, so the image store's 40 layers take ~900. Given
 * back after the mount, like the config. */
static char overlay_data[4096] __attribute__((aligned(4096)));
static size_t overlay_len;

static void __attribute__((format(printf, 1, 2))) append_data(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(overlay_data + overlay_len, sizeof overlay_data - overlay_len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof overlay_data - overlay_len) {
		errno = E2BIG;
		die("overlay", "mount data exceeds a page (too many layers)");
	}
	overlay_len += (size_t)n;
}

#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
struct warren_mount_attr {
	unsigned long long attr_set, attr_clr, propagation, userns_fd;
};

static int open_dir(const char *dir)
{
	int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		die("open", dir);
	return fd;
}

/* The user-namespace mode (config userns=BASE:SIZE): root inside is host
 * id BASE, an unprivileged id outside. Every mount is still made here, by
 * the host's root in namespaces the host's user namespace owns, so the
 * sandbox's root holds no capability over its mounts, network, hostname
 * or cgroup; only at the end does this process join the new user
 * namespace (join_userns). The image's layers are idmapped clones of the
 * node's layer mounts (on-disk id N shows as BASE+N), handed to overlayfs
 * as detached mounts (Linux 6.15 takes them as layers); the upper
 * directory is not idmapped (overlayfs, mounted by the host's root,
 * creates its work files as host id 0, which an idmapped upper cannot
 * store), so it keeps host ids, BASE+N, which the daemon's file calls and
 * commit shift (internal/container/userns.go). -1: not in this mode. */
static int userns_fd = -1;
static unsigned long userns_base;
/* Closing a detached mount unmounts it, which waits for an RCU grace
 * period (~0.2 ms each here): the namespace's holder closes them once
 * the sandbox is up, while PID 1 serves (finish_userns). */
static int idmapped_fds[128];
static size_t n_idmapped;
static int holder_go[2] = {-1, -1}; /* closing [1] lets the holder finish */

#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#define OPEN_TREE_CLONE_FLAG 1
#define MOUNT_ATTR_IDMAP_FLAG 0x00100000ULL

/* An idmapped clone of the mount at dir (a layer), detached. */
static int open_idmapped(const char *dir)
{
	int fd = (int)syscall(SYS_open_tree, AT_FDCWD, dir, OPEN_TREE_CLONE_FLAG | O_CLOEXEC);
	if (fd < 0)
		die("open_tree", dir);
	struct warren_mount_attr a = {.attr_set = MOUNT_ATTR_IDMAP_FLAG, .userns_fd = (unsigned long long)userns_fd};
	if (syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH, &a, sizeof a) < 0)
		die("idmap layer (its filesystem must support idmapped mounts)", dir);
	return fd;
}

#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#define MOVE_MOUNT_F_EMPTY_PATH_FLAG 0x4
#define AT_RECURSIVE_FLAG 0x8000

/* Makes the tree built at "." (the sandbox's root and its mounts) the
 * root of a mount namespace of its own without pivot_root, which walks
 * every thread on the node (chroot_fs_refs, under the tasklist lock that
 * every fork and exit takes): ~19% of the node's CPU at 5,000 sandboxes,
 * and growing with them. A clone of the tree goes on top of a copy of the
 * daemon's stage, a namespace whose only mount is an empty read-only
 * tmpfs (internal/container/stage.go), and this process chroots into it.
 * What lies under the sandbox's root is that empty tmpfs, not the node's
 * filesystems: a process that climbs out of a chroot of its own
 * (CAP_SYS_CHROOT) with ".." lands back on the sandbox's root, the mount
 * that covers the stage's (test/e2e, TestAdversarialChrootEscape...), and
 * only an unmount of "/" (CAP_SYS_ADMIN, which sandboxes lack) would show
 * the empty stage. The namespace the clone gave us,
 * the node's mounts with the tree on them, goes with its last user: us,
 * at the setns. */
static void root_on_stage(void)
{
	int tree = (int)syscall(SYS_open_tree, AT_FDCWD, ".", OPEN_TREE_CLONE_FLAG | AT_RECURSIVE_FLAG | O_CLOEXEC);
	if (tree < 0)
		die("open_tree", "the sandbox's root");
	if (syscall(SYS_setns, FD_CONFIG, CLONE_NEWNS) < 0)
		die("setns", "stage mount namespace");
	close(FD_CONFIG);
	if (unshare(CLONE_NEWNS) < 0)
		die("unshare", "mount namespace on the stage");
	if (syscall(SYS_move_mount, tree, "", AT_FDCWD, "/", MOVE_MOUNT_F_EMPTY_PATH_FLAG) < 0)
		die("move_mount", "the sandbox's root onto the stage");
	if (fchdir(tree) < 0 || chroot(".") < 0)
		die("chroot", "the sandbox's root");
	close(tree);
}

/* Gives what this stage created on the sandbox's filesystems (mount
 * points, /tmp, its /dev) to the sandbox's root: host root would show
 * inside as the overflow id. */
static void own(const char *path)
{
	if (userns_fd >= 0 && lchown(path, (uid_t)userns_base, (gid_t)userns_base) < 0)
		die("chown", path);
}

/* Mounts the overlay of lower (':'-separated, top-most first; split in
 * place, in the config buffer), upper and work at rootfs through
 * descriptors: overlayfs keeps the option strings it was given for
 * mountinfo, and these name only /proc/self/fd/N. The mount holds the
 * directories once the descriptors are closed. */
static void mount_overlay(const char *rootfs, char *lower, const char *upper, const char *work, const char *opts)
{
	int fds[128];
	size_t nfd = 0;
	append_data("lowerdir=");
	for (char *p = lower;;) {
		char *end = strchr(p, ':');
		if (nfd >= sizeof fds / sizeof fds[0] - 2) {
			errno = E2BIG;
			die("overlay", "too many layers");
		}
		if (end)
			*end = 0;
		fds[nfd] = userns_fd >= 0 ? open_idmapped(p) : open_dir(p);
		append_data("%s/proc/self/fd/%d", nfd ? ":" : "", fds[nfd]);
		nfd++;
		if (!end)
			break;
		p = end + 1;
	}
	fds[nfd] = open_dir(upper);
	append_data(",upperdir=/proc/self/fd/%d", fds[nfd++]);
	fds[nfd] = open_dir(work);
	append_data(",workdir=/proc/self/fd/%d", fds[nfd++]);
	if (opts && *opts)
		append_data(",%s", opts);
	do_mount("overlay", rootfs, "overlay", MS_NODEV, overlay_data);
	for (size_t i = 0; i < nfd; i++)
		if (userns_fd >= 0 && i < nfd - 2)
			idmapped_fds[n_idmapped++] = fds[i];
		else
			close(fds[i]);
	madvise(overlay_data, sizeof overlay_data, MADV_DONTNEED);
}

/* Paths of /proc and /sys that leak host information or control the host.
 * sys/devices/virtual/block holds the loop devices, whose backing_file
 * names the node's disk images (<state>/disks/<id>.img, another
 * sandbox's id) and layer blobs. */
/* kpage{cgroup,flags,count} expose every physical page of the node (and
 * kpagecgroup has had a kernel bug); vmallocinfo and vmcoreinfo name
 * kernel addresses; kmsg is the node's log. */
static const char *masked_files[] = {"proc/kcore", "proc/keys", "proc/timer_list", "proc/sched_debug",
				     "proc/latency_stats", "proc/sysrq-trigger", "proc/kpagecgroup",
				     "proc/kpageflags", "proc/kpagecount", "proc/kmsg", "proc/vmallocinfo",
				     "sys/kernel/vmcoreinfo", NULL};
static const char *masked_dirs[] = {"proc/acpi", "proc/scsi", "sys/firmware", "sys/devices/virtual/powercap",
				    "sys/devices/virtual/block", "sys/kernel/security", "sys/kernel/slab",
				    "sys/kernel/debug", "sys/kernel/tracing", "sys/fs/cgroup", NULL};
static const char *readonly_dirs[] = {"proc/bus", "proc/fs", "proc/irq", "proc/sys", NULL};

#define RO_FLAGS (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)

static void remount_ro(const char *dst)
{
	do_mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | RO_FLAGS, NULL);
}

/* /sys and everything bound below it (masks, the cgroup view, the CPU
 * view) are made read-only at the end by one mount_setattr (Linux 5.12)
 * of the whole tree instead of a remount of each bind: ~3 us a mount
 * call here, ten of them per create. sys_tree_ro says whether the kernel
 * has it (probed on /sys itself: set_sys_ro). Without it each bind below
 * /sys is remounted on its own. */
static int sys_tree_ro;

static int setattr_ro(const char *dst, unsigned flags)
{
	/* MOUNT_ATTR_RDONLY | NOSUID | NODEV | NOEXEC; AT_RECURSIVE */
	struct warren_mount_attr a = {.attr_set = 0x1 | 0x2 | 0x4 | 0x8};
	return (int)syscall(SYS_mount_setattr, AT_FDCWD, dst, flags, &a, sizeof a);
}

static void set_sys_ro(void)
{
	if (setattr_ro("sys", 0) == 0) {
		sys_tree_ro = 1;
		return;
	}
	if (errno != ENOSYS)
		die("mount_setattr", "sys");
	remount_ro("sys");
}

/* Binds src at dst (rec: MS_REC or 0) read-only: now, or for a bind below
 * /sys with the tree at the end. 0 where src or dst does not exist (a
 * path this kernel lacks, a hierarchy the group was not made in). */
static int bind_ro(const char *src, const char *dst, unsigned long rec)
{
	if (mount(src, dst, NULL, MS_BIND | rec, NULL) < 0) {
		if (errno == ENOENT)
			return 0;
		die("bind", dst);
	}
	if (!sys_tree_ro || strncmp(dst, "sys/", 4))
		remount_ro(dst);
	return 1;
}

/* The sandbox's own cgroup, read-only, at /sys/fs/cgroup: "dir>source"
 * entries, ';'-separated (internal/container/views.go), each a bind of
 * the group's directory in one hierarchy (the host's path, visible here
 * until pivot_root), which in our cgroup namespace shows as that
 * hierarchy's root and names no host path. A source that is gone (a
 * hierarchy the group was not made in) leaves its directory empty. Where
 * there are v1 hierarchies, skel (the node's shared directory of their
 * mount points) goes first, read-only, at /sys/fs/cgroup. Split in
 * place. */
static void mount_cgroups(const char *skel, char *spec)
{
	if (skel)
		bind_ro(skel, "sys/fs/cgroup", MS_REC);
	for (char *p = spec; p;) {
		char *next = strchr(p, ';');
		if (next)
			*next++ = 0;
		char *src = strchr(p, '>');
		if (!src) {
			errno = EINVAL;
			die("config", "cgroups");
		}
		*src++ = 0;
		char dst[128];
		int n = snprintf(dst, sizeof dst, "sys/fs/cgroup%s%s", *p ? "/" : "", p);
		if (n < 0 || (size_t)n >= sizeof dst) {
			errno = ENAMETOOLONG;
			die("config", "cgroups");
		}
		bind_ro(src, dst, 0);
		p = next;
	}
}

/* Read-only binds of the node's view files over what the sandbox reads
 * its size from (/sys/devices/system/cpu/online, /proc/cpuinfo:
 * internal/container/views.go): "src>dst" entries, ';'-separated, dst
 * relative to the new root. Split in place. */
static void bind_views(char *spec)
{
	for (char *p = spec; p;) {
		char *next = strchr(p, ';');
		if (next)
			*next++ = 0;
		char *dst = strchr(p, '>');
		if (!dst) {
			errno = EINVAL;
			die("config", "views");
		}
		*dst++ = 0;
		if (!bind_ro(p, dst, 0))
			die("bind", dst);
		p = next;
	}
}

static void setup_dev(void)
{
	static const struct {
		const char *name;
		unsigned maj, min;
	} nodes[] = {{"dev/null", 1, 3}, {"dev/zero", 1, 5}, {"dev/full", 1, 7},
		     {"dev/random", 1, 8}, {"dev/urandom", 1, 9}, {"dev/tty", 5, 0}};
	static const char *links[][2] = {{"pts/ptmx", "dev/ptmx"}, {"/proc/self/fd", "dev/fd"},
					 {"/proc/self/fd/0", "dev/stdin"}, {"/proc/self/fd/1", "dev/stdout"},
					 {"/proc/self/fd/2", "dev/stderr"}};
	umask(0);
	for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++)
		if (mknod(nodes[i].name, S_IFCHR | 0666, makedev(nodes[i].maj, nodes[i].min)) < 0)
			die("mknod", nodes[i].name);
		else
			own(nodes[i].name);
	if (mkdir("dev/pts", 0755) < 0)
		die("mkdir", "dev/pts");
	/* /dev/shm is a directory of /dev, not a tmpfs of its own: every
	 * superblock per sandbox grows every memory cgroup's shrinker map on
	 * the node. */
	if (mkdir("dev/shm", 01777) < 0)
		die("mkdir", "dev/shm");
	own("dev/shm");
	do_mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
	own("dev/pts");
	own("dev/pts/ptmx");
	for (size_t i = 0; i < sizeof links / sizeof links[0]; i++)
		if (symlink(links[i][0], links[i][1]) < 0)
			die("symlink", links[i][1]);
		else
			own(links[i][1]);
	umask(022);
}

/* Makes fd the exe link. PR_SET_MM_EXE_FILE alone needs CAP_SYS_RESOURCE,
 * which these nodes' bounding set lacks; PR_SET_MM_MAP needs
 * CAP_CHECKPOINT_RESTORE (or CAP_SYS_ADMIN) instead, and takes the
 * memory map's current values, read from /proc/self/stat, unchanged.
 * (/proc here is still the node's, where /proc/self is this process.) */
static void set_exe(int fd)
{
	/* start_code, end_code, start_stack; start_data .. env_end */
	static const int which[] = {26, 27, 28, 45, 46, 47, 48, 49, 50, 51};
	unsigned long f[10];
	if (warren_stat_fields(f, which, 10) < 0)
		die("read", "/proc/self/stat");
	struct prctl_mm_map m = {
		.start_code = f[0], .end_code = f[1], .start_stack = f[2],
		.start_data = f[3], .end_data = f[4], .start_brk = f[5],
		.brk = (unsigned long)syscall(SYS_brk, 0),
		.arg_start = f[6], .arg_end = f[7], .env_start = f[8], .env_end = f[9],
		.auxv = NULL, .auxv_size = 0, .exe_fd = (unsigned)fd,
	};
	if (prctl(PR_SET_MM, PR_SET_MM_MAP, (unsigned long)&m, sizeof m, 0) < 0)
		die("prctl", "PR_SET_MM_MAP");
}

/* The agent runs from what the daemon exec'd: a memfd, or a file on a
 * host mount. CRIU can restore neither (docs/HIBERNATE.md), so the same
 * bytes, a read-only file of the node's agent tmpfs (agentfs.go), are
 * bound at /dev/.warren-agent and every mapping of the old file moves
 * onto that one: a fresh private mapping of it, into which only the pages
 * this process wrote are copied (the rest stay shared page cache), moved
 * over the old one by mremap. Then it becomes the exe link. Text is
 * replaced by the same bytes at the same address, so the code running
 * here, and the userns holder sharing our memory, notice nothing.
 * bind_agent binds it (as the host's root); adopt_exe moves onto it, in
 * the mount namespace the sandbox keeps (the mappings and exe link name
 * the mount they were opened on, which CRIU must find in the sandbox's
 * table): after userns_namespaces in the user-namespace mode. Both run
 * with the working directory at the sandbox's root. */
static const char agent_dst[] = "dev/.warren-agent";

static void bind_agent(const char *src)
{
	int fd = open(agent_dst, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0);
	if (fd < 0)
		die("create", agent_dst);
	close(fd);
	do_mount(src, agent_dst, NULL, MS_BIND, NULL);
}

static void adopt_exe(void)
{
	const char *src = agent_dst, *dst = agent_dst;
	int exe = open(dst, O_RDONLY | O_CLOEXEC);
	struct stat old, new;
	if (exe < 0 || fstat(exe, &new) < 0)
		die("open", dst);
	if (stat("proc/self/exe", &old) < 0)
		die("stat", "proc/self/exe");
	if (old.st_size != new.st_size)
		die("agent executable differs from", src);
	static char maps[16384];
	int mfd = open("proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (mfd < 0)
		die("open", "proc/self/maps");
	size_t n = 0;
	for (ssize_t r; n < sizeof maps - 1 && (r = read(mfd, maps + n, sizeof maps - 1 - n)) != 0;) {
		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("read", "proc/self/maps");
		}
		n += r;
	}
	close(mfd);
	maps[n] = 0;
	struct {
		unsigned long start, end, off;
		int prot;
	} v[16];
	int nv = 0;
	for (char *line = maps, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		unsigned long start, end, off, ino;
		unsigned maj, min;
		char perms[5];
		if (sscanf(line, "%lx-%lx %4s %lx %x:%x %lu", &start, &end, perms, &off, &maj, &min, &ino) != 7)
			continue;
		if (ino != old.st_ino || maj != major(old.st_dev) || min != minor(old.st_dev))
			continue;
		if (nv == (int)(sizeof v / sizeof v[0]))
			die("too many agent mappings", NULL);
		v[nv].start = start, v[nv].end = end, v[nv].off = off;
		v[nv].prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
			     (perms[2] == 'x' ? PROT_EXEC : 0);
		nv++;
	}
	if (nv == 0)
		die("no mapping of the agent executable", NULL);
	long page = sysconf(_SC_PAGESIZE);
	for (int i = 0; i < nv; i++) {
		size_t len = v[i].end - v[i].start;
		char *at = (char *)v[i].start;
		char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, exe, v[i].off);
		if (m == MAP_FAILED)
			die("mmap", dst);
		for (size_t p = 0; p < len; p += page)
			if ((v[i].prot & PROT_READ) && memcmp(m + p, at + p, page))
				memcpy(m + p, at + p, page);
		if (mprotect(m, len, v[i].prot) < 0)
			die("mprotect", dst);
		if (mremap(m, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, at) == MAP_FAILED)
			die("mremap", dst);
	}
	set_exe(exe);
	close(exe);
}

static void loopback_up(void)
{
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket", "lo");
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	strcpy(ifr.ifr_name, "lo");
	if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0)
		die("SIOCGIFFLAGS", "lo");
	ifr.ifr_flags |= IFF_UP;
	if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0)
		die("SIOCSIFFLAGS", "lo");
	close(fd);
}

/* The capability bounding set of every sandbox process: what root inside
 * needs to manage files and users, nothing that reaches the kernel or
 * devices (no SYS_ADMIN, NET_ADMIN, MKNOD, NET_RAW, SYS_PTRACE, ...). */
static const int kept_caps[] = {CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FSETID, CAP_FOWNER, CAP_SETGID, CAP_SETUID,
				CAP_SETPCAP, CAP_SETFCAP, CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT, CAP_KILL,
				CAP_AUDIT_WRITE};

static void drop_caps(void)
{
	for (int c = 0; c <= 63; c++) {
		int keep = 0;
		for (size_t i = 0; i < sizeof kept_caps / sizeof kept_caps[0]; i++)
			keep |= kept_caps[i] == c;
		if (keep || prctl(PR_CAPBSET_DROP, c, 0, 0, 0) == 0)
			continue;
		/* EINVAL: past the kernel's last capability (none is kept up
		 * there), so the rest would fail the same way. */
		if (errno == EINVAL)
			break;
		die("drop capability", NULL);
	}
}


/* Closes every fd from first on, and leaves this process with an fd table
 * sized for what is left. The clone that made us copied the daemon's table,
 * which is sized for the daemon's highest fd (one pidfd per sandbox: at
 * 3,000 sandboxes a 32 KiB array plus bitmaps), and closing fds never
 * shrinks a table. close_range(CLOSE_RANGE_UNSHARE) copies only the fds
 * below first into a table of its own, but only when the table is shared:
 * so share it for a moment with a child that waits to be killed. */
static char sharer_stack[4096] __attribute__((aligned(4096)));

/* The child shares our memory too (no page tables to copy): it only
 * sleeps, on a stack of its own, until it is killed. */
static int share_until_killed(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return 0;
}

/* The size of our fd table (FDSize of /proc/self/status: the host's
 * /proc, still ours before pivot_root), or 0 where it cannot be read. */
static long fd_table_size(void)
{
	char buf[2048];
	int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	char *p = strstr(buf, "\nFDSize:");
	return p ? strtol(p + 8, NULL, 10) : 0;
}

static void close_all_from(unsigned first)
{
	/* A table of at most 64 fds is the one embedded in the fd table's
	 * struct, which a copy cannot make smaller: the clone copies only up
	 * to the daemon's highest open fd, below 64 on a node with few
	 * sandboxes. The sharing child (its clone, kill and reaping, ~80 us
	 * of every create here) is then for nothing. ~3 us to read. */
	long size = fd_table_size();
	if (size > 0 && size <= 64) {
		syscall(SYS_close_range, first, ~0U, 0);
		return;
	}
	pid_t child = clone(share_until_killed, sharer_stack + sizeof sharer_stack, CLONE_VM | CLONE_FILES | SIGCHLD, NULL);
	if (syscall(SYS_close_range, first, ~0U, child > 0 ? CLOSE_RANGE_UNSHARE : 0) < 0 && child > 0)
		syscall(SYS_close_range, first, ~0U, 0);
	if (child > 0) {
		kill(child, SIGKILL);
		while (waitpid(child, NULL, 0) < 0 && errno == EINTR)
			;
		madvise(sharer_stack, sizeof sharer_stack, MADV_DONTNEED);
	}
}

/* The child that makes the user namespace: it opens its own /proc
 * directory into the fd table it shares with us (the host's /proc names
 * it by its host pid, which we cannot know from inside our pid
 * namespace) and says which fd. It then holds the namespace until we
 * close holder_go[1] (finish_userns), closes the idmapped layer mounts
 * (in the table and memory it shares with us: the unmounts' waits are
 * its, not PID 1's) and exits; the agent reaps it as an orphan. Only it
 * closes holder_go[0] and those fds, so no number it closes can have
 * been reused. */
static int userns_child(void *arg)
{
	int fd = open("/proc/self", O_PATH | O_DIRECTORY | O_CLOEXEC);
	(void)!write(*(int *)arg, &fd, sizeof fd);
	char c;
	while (read(holder_go[0], &c, 1) < 0 && errno == EINTR)
		;
	close(holder_go[0]);
	for (size_t i = 0; i < n_idmapped; i++)
		close(idmapped_fds[i]);
	_exit(0);
}

static void write_map(int procfd, const char *file, const char *map)
{
	int fd = openat(procfd, file, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, map, strlen(map)) < 0)
		die("write", file);
	close(fd);
}

/* Makes the sandbox's user namespace (spec "BASE:SIZE": ids 0..SIZE-1
 * inside are BASE.. outside) and keeps it in userns_fd: a child made in
 * it holds it while we, in the parent namespace with CAP_SETUID and
 * CAP_SETGID there, write its maps (setgroups stays allowed: root inside
 * may change its groups, as on any machine). */
static void make_userns(const char *spec)
{
	char *end;
	userns_base = strtoul(spec, &end, 10);
	unsigned long size = *end == ':' ? strtoul(end + 1, &end, 10) : 0;
	if (*end || !userns_base || !size) {
		errno = EINVAL;
		die("config", "userns");
	}
	char map[64];
	snprintf(map, sizeof map, "0 %lu %lu\n", userns_base, size);
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0 || pipe2(holder_go, O_CLOEXEC) < 0)
		die("pipe", "user namespace");
	pid_t child = clone(userns_child, sharer_stack + sizeof sharer_stack,
			    CLONE_VM | CLONE_FILES | CLONE_NEWUSER | SIGCHLD, &p[1]);
	if (child < 0)
		die("clone", "user namespace");
	int procfd = -1;
	ssize_t n;
	while ((n = read(p[0], &procfd, sizeof procfd)) < 0 && errno == EINTR)
		;
	if (n != sizeof procfd || procfd < 0) {
		kill(child, SIGKILL); /* our exit takes the pid namespace anyway */
		errno = n < 0 ? errno : EIO;
		die("open", "user namespace child's /proc");
	}
	write_map(procfd, "uid_map", map);
	write_map(procfd, "gid_map", map);
	userns_fd = openat(procfd, "ns/user", O_RDONLY | O_CLOEXEC);
	if (userns_fd < 0)
		die("open", "user namespace");
	close(procfd);
	close(p[0]);
	close(p[1]);
}

/* PID 1 (the agent) lets go of CAP_SYS_ADMIN in the user namespace, once
 * the filters are in (installing them without no_new_privs needed it): it
 * mounts nothing and sets no hostname, and it was the one process there
 * holding it (the bounding set keeps it from the others). That is what
 * stands between a sandbox restored by CRIU and its masks, whose mounts
 * CRIU makes from inside the user namespace, so they are not locked as at
 * create (docs/SECURITY.md); CRIU restores the sets as dumped. The others
 * it keeps: PID 1 must still hold capabilities no sandbox process can
 * (CAP_SYS_PTRACE, CAP_NET_ADMIN, ...), or the kernel would let root there
 * ptrace it and open /proc/1/fd (userns_namespaces). */
static void drop_sys_admin(void)
{
	struct warren_cap_header h = {.version = WARREN_CAP_V3};
	struct warren_cap_data d[2];
	if (syscall(SYS_capget, &h, d) < 0)
		die("capget", NULL);
	uint32_t bit = 1u << (CAP_SYS_ADMIN % 32);
	d[CAP_SYS_ADMIN / 32].effective &= ~bit;
	d[CAP_SYS_ADMIN / 32].permitted &= ~bit;
	d[CAP_SYS_ADMIN / 32].inheritable &= ~bit;
	if (syscall(SYS_capset, &h, d) < 0)
		die("capset", "drop CAP_SYS_ADMIN");
}

/* Lets the holder close what make_userns and mount_overlay left open,
 * once the sandbox is up. */
static void finish_userns(void)
{
	if (holder_go[1] >= 0)
		close(holder_go[1]);
}

/* Joins the sandbox's user namespace as root there (host id BASE): last,
 * after every step that needs the host's root (mounts, hostname, the
 * loopback, rlimits, the audit id). Namespaces owned by the host's user
 * namespace stay out of the sandbox root's reach. */
static void join_userns(void)
{
	if (syscall(SYS_setns, userns_fd, CLONE_NEWUSER) < 0)
		die("setns", "user namespace");
	close(userns_fd);
	if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
		die("become root", "in the user namespace");
}

/* After join_userns: the sandbox's mount, UTS and IPC namespaces, made
 * now, are owned by its user namespace, as CRIU requires of the tree it
 * checkpoints (every namespace of the tree but the network's, which
 * checkpoint.go keeps out of the dump, must belong to the dumped user
 * namespace; it checks by entering them from that namespace, through
 * /proc/1/ns).
 * The mount namespace is a copy of the one built above by the host's
 * root, and a copy into a less privileged namespace locks every mount in
 * it: none can be unmounted alone (to reveal what a mask covers) or have
 * its read-only, nosuid, nodev or noexec flag cleared, even by a process
 * holding CAP_SYS_ADMIN here. The clone made us no UTS or IPC namespace
 * in this mode: until now we ran in the daemon's, and changed nothing
 * there. PID 1 stays dumpable (the join's change of credentials cleared
 * it, and the agent would clear it again): the kernel lets a process in
 * the user namespace open /proc/1/ns/ (as CRIU's check does) only when
 * PID 1 is dumpable, since its memory was made in the node's user
 * namespace, which the process holds no capability in. Sandbox processes
 * still cannot ptrace PID 1, open /proc/1/fd/ or read /proc/1/mem or
 * environ: the kernel also requires their permitted capabilities to
 * include all of PID 1's (every one in the user namespace but
 * CAP_SYS_ADMIN, drop_sys_admin), and the bounding set (drop_caps) keeps
 * theirs to a few. CRIU restores the flag with the tree. */
static void userns_namespaces(const char *hostname, int agent_exe)
{
	if (unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC) < 0)
		die("unshare", "mount, UTS and IPC namespaces in the user namespace");
	if (agent_exe)
		adopt_exe();
	if (hostname && sethostname(hostname, strlen(hostname)) < 0)
		die("sethostname", hostname);
	if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) < 0)
		die("prctl", "PR_SET_DUMPABLE");
	warren_agent_dumpable = 1;
}

/* Resource limits the agent's own work counts against: its descriptors
 * (a socket per connection and running process), CPU seconds (a hard cpu
 * limit would SIGKILL PID 1 once it had served that long), memory (kept
 * output) and stack. The agent keeps the daemon's and sets these in each
 * process it starts (warren_agent_child_rlimits, agent_linux.c). */
static int agent_bound(long res)
{
	return res == RLIMIT_NOFILE || res == RLIMIT_CPU || res == RLIMIT_AS || res == RLIMIT_DATA ||
	       res == RLIMIT_STACK;
}

/* Applies the config's rlimits: "NUM:SOFT:HARD" entries, ','-separated,
 * decimal (RLIM_INFINITY as 2^64-1; internal/rlimit writes them). PID 1
 * takes them with setrlimit and every sandbox process inherits them,
 * except the agent-bound ones, which are passed on. Each is checked here
 * as the kernel would check it without CAP_SYS_RESOURCE (a hard limit
 * cannot rise), which PID 1 still has: no sandbox gets a hard limit above
 * the daemon's own (memlock's is 8 MiB under systemd's defaults), and a
 * refused one fails the create rather than every exec. */
static void apply_rlimits(const char *spec)
{
	static const char *names[] = {"cpu", "fsize", "data", "stack", "core", "rss", "nproc", "nofile",
				      "memlock", "as", "locks", "sigpending", "msgqueue", "nice", "rtprio", "rttime"};
	char child[1024];
	size_t clen = 0;
	for (const char *p = spec; *p;) {
		char *end;
		struct rlimit r = {0, 0}, cur;
		long res = strtol(p, &end, 10);
		int ok = *end == ':';
		if (ok)
			r.rlim_cur = strtoull(end + 1, &end, 10);
		ok = ok && *end == ':';
		if (ok)
			r.rlim_max = strtoull(end + 1, &end, 10);
		if (!ok || (*end != ',' && *end) || res < 0 || res >= (long)(sizeof names / sizeof names[0])) {
			errno = EINVAL;
			die("config", "rlimits");
		}
		const char *arg = names[res];
		if (getrlimit(res, &cur) < 0)
			die("getrlimit", arg);
		if (r.rlim_cur > r.rlim_max || r.rlim_max > cur.rlim_max) {
			errno = r.rlim_cur > r.rlim_max ? EINVAL : EPERM;
			die("setrlimit", arg);
		}
		if (!agent_bound(res)) {
			if (setrlimit(res, &r) < 0)
				die("setrlimit", arg);
		} else {
			int n = snprintf(child + clen, sizeof child - clen, "%s%.*s", clen ? "," : "", (int)(end - p), p);
			if (n < 0 || (size_t)n >= sizeof child - clen) {
				errno = E2BIG;
				die("config", "rlimits");
			}
			clen += (size_t)n;
		}
		p = *end ? end + 1 : end;
	}
	if (clen)
		warren_agent_child_rlimits(child);
}

/* seccomp's ABI (musl ships no linux/filter.h or linux/seccomp.h). */
struct sock_filter {
	unsigned short code;
	unsigned char jt, jf;
	unsigned int k;
};
struct sock_fprog {
	unsigned short len;
	struct sock_filter *filter;
};
#define BPF_MAXINSNS 4096
#define SECCOMP_SET_MODE_FILTER 1
#define SECCOMP_FILTER_FLAG_LOG 2
#ifndef PR_SET_NO_NEW_PRIVS
#define PR_SET_NO_NEW_PRIVS 38
#endif

/* The decoded filter: at most BPF_MAXINSNS entries. Page-aligned, so
 * that its pages can be given back once the kernel has its copy. */
static struct sock_filter filter[BPF_MAXINSNS] __attribute__((aligned(4096)));

static int unhex(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Installs a filter of the config (hex of struct sock_filter entries, in
 * the machine's byte order), after no_new_privs: the filter binds every
 * process the agent starts. flags: SECCOMP_FILTER_FLAG_LOG for the audit
 * filter, whose refusals the kernel logs. */
static void install_seccomp(const char *hex, unsigned flags)
{
	size_t n = strlen(hex);
	unsigned char *out = (unsigned char *)filter;
	if (n == 0 || n % 16 || n / 2 > sizeof filter) {
		errno = EINVAL;
		die("config", "seccomp");
	}
	for (size_t i = 0; i < n; i += 2) {
		int hi = unhex(hex[i]), lo = unhex(hex[i + 1]);
		if (hi < 0 || lo < 0) {
			errno = EINVAL;
			die("config", "seccomp");
		}
		out[i / 2] = (unsigned char)(hi << 4 | lo);
	}
	struct sock_fprog prog = {.len = (unsigned short)(n / 16), .filter = filter};
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog) < 0)
		die("seccomp", NULL);
	madvise(filter, sizeof filter, MADV_DONTNEED);
}

/* The agent's listening socket at path, as fd 4: made here, so that it
 * belongs to the sandbox's network namespace (CRIU dumps only the sockets
 * of the namespaces of the tree it dumps: checkpoint.go), at the host path
 * the daemon connects to, which this mount namespace still sees. It is
 * bound by its name from inside its directory, since the sandbox's
 * /proc/net/unix shows the path given here: the run directory's is the
 * node's business. */
static void listen_at(const char *path)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	const char *slash = strrchr(path, '/');
	const char *name = slash ? slash + 1 : path;
	if (strlen(name) >= sizeof a.sun_path || !*name) {
		errno = ENAMETOOLONG;
		die("agent socket", path);
	}
	strcpy(a.sun_path, name);
	if (slash) {
		char dir[4096];
		size_t n = (size_t)(slash - path);
		if (n >= sizeof dir) {
			errno = ENAMETOOLONG;
			die("agent socket", path);
		}
		memcpy(dir, path, n);
		dir[n ? n : 1] = 0;
		if (!n)
			dir[0] = '/';
		if (chdir(dir) < 0)
			die("chdir", dir);
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket", path);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0)
		die("bind", path);
	if (listen(fd, SOMAXCONN) < 0)
		die("listen", path);
	if (chdir("/") < 0)
		die("chdir", "/");
	if (fd != FD_LISTEN) {
		if (dup3(fd, FD_LISTEN, O_CLOEXEC) < 0)
			die("dup3", path);
		close(fd);
	}
}

static void __attribute__((noreturn)) init_main(void)
{
	size_t len = 0;
	for (;;) {
		ssize_t n = read(FD_CONFIG, config + len, sizeof config - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("read config", NULL);
		if (n == 0)
			break;
		len += (size_t)n;
		if (len >= sizeof config - 1) {
			errno = E2BIG;
			die("read config", NULL);
		}
	}
	close(FD_CONFIG);
	config[len] = 0;
	/* A network namespace of the daemon's pool (netns: its fd, lo
	 * already up: internal/container/netnspool.go), joined first; without
	 * one the clone made ours. */
	const char *netns = conf("netns", len);
	if (netns && syscall(SYS_setns, atoi(netns), CLONE_NEWNET) < 0)
		die("setns", "network namespace");
	/* Whatever else the daemon inherited from its own parent and did not
	 * mark close-on-exec must not live on in PID 1 of a sandbox: fds 4 and
	 * 5 are ours, everything above goes (6 is the standalone agent the
	 * daemon exec'd, when that is what we are). */
	/* The daemon's stage (root_on_stage), kept at FD_CONFIG's number,
	 * free now, through close_all_from. */
	const char *stage = conf("stage", len);
	if (stage && dup3(atoi(stage), FD_CONFIG, O_CLOEXEC) < 0)
		die("dup3", "stage mount namespace");
	close_all_from(FD_STATUS + 1);
	const char *sock = conf("agent_socket", len);
	if (sock)
		listen_at(sock);
	const char *userns = conf("userns", len);
	if (userns)
		make_userns(userns);
	const char *rootfs = conf("rootfs", len), *overlay = conf("overlay_options", len);
	char *lower = (char *)conf("lower", len);
	const char *upper = conf("upper", len), *work = conf("work", len);
	const char *hostname = conf("hostname", len), *empty = conf("empty", len);
	const char *sysfs = conf("sysfs", len);
	const char *dev = conf("dev", len);
	if (!rootfs || !empty) {
		errno = EINVAL;
		die("config", "rootfs/empty missing");
	}

	/* Only now, inside our cgroup, so that it is the namespace's root. */
	if (unshare(CLONE_NEWCGROUP) < 0)
		die("unshare", "cgroup namespace");
	/* Nothing mounted here may propagate to the host, and host mounts
	 * made later must not appear here. */
	do_mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
	if (lower) {
		if (!upper || !work) {
			errno = EINVAL;
			die("config", "upper/work missing");
		}
		mount_overlay(rootfs, lower, upper, work, overlay);
	}
	if (chdir(rootfs) < 0)
		die("chdir", rootfs);
	static const char *dirs[] = {"proc", "dev", "sys"};
	for (size_t i = 0; i < 3; i++)
		if (mkdir(dirs[i], 0755) == 0)
			own(dirs[i]);
		else if (errno != EEXIST)
			die("mkdir", dirs[i]);
	/* An image without /tmp gets the one every machine has: writable by
	 * all, sticky. One the image has keeps its mode. */
	if (mkdir("tmp", 01777) == 0) {
		own("tmp");
		if (chmod("tmp", 01777) < 0) /* the umask narrowed it (and chown clears nothing here: no setuid bits) */
			die("chmod", "tmp");
	} else if (errno != EEXIST) {
		die("mkdir", "tmp");
	}
	do_mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	/* Root in a user namespace holds no CAP_NET_BIND_SERVICE over a
	 * network namespace the host's owns: let every process bind low
	 * ports, as Docker and Podman do, so that a server the task starts as
	 * root on port 80 still works. Before /proc/sys turns read-only. */
	if (userns_fd >= 0) {
		int fd = open("proc/sys/net/ipv4/ip_unprivileged_port_start", O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, "0", 1) < 0)
			die("write", "ip_unprivileged_port_start");
		close(fd);
	}
	/* Our own directory on the node's shared devfs tmpfs
	 * (internal/container/devfs.go): our own inodes, no superblock of our
	 * own. The mount is nosuid and allows device nodes. */
	if (dev) {
		if (mkdir(dev, 0755) < 0 || chmod(dev, 0755) < 0) /* whatever our umask */
			die("mkdir", dev);
		own(dev);
		do_mount(dev, "dev", NULL, MS_BIND, NULL);
	} else {
		do_mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_STRICTATIME, "mode=755,size=65536k");
	}
	setup_dev();
	const char *agent_exe = conf("agent_exe", len);
	if (agent_exe) {
		bind_agent(agent_exe);
		/* After root_on_stage, which clones the mounts: a mapping of
		 * this bind would keep the original, left behind. */
		if (userns_fd < 0 && !stage)
			adopt_exe();
	}
	/* The node's shared sysfs (internal/container/sysfs.go): one
	 * superblock for all sandboxes instead of one each. */
	if (sysfs)
		do_mount(sysfs, "sys", NULL, MS_BIND | MS_REC, NULL);
	else
		do_mount("sysfs", "sys", "sysfs", RO_FLAGS, NULL);
	set_sys_ro();
	for (int i = 0; masked_files[i]; i++)
		if (mount("dev/null", masked_files[i], NULL, MS_BIND, NULL) < 0 && errno != ENOENT)
			die("mask", masked_files[i]);
	/* Bind mounts of one empty directory, not a tmpfs each: no new
	 * superblocks. */
	char *cgroups = (char *)conf("cgroups", len);
	for (int i = 0; masked_dirs[i]; i++)
		if (!cgroups || strcmp(masked_dirs[i], "sys/fs/cgroup"))
			bind_ro(empty, masked_dirs[i], MS_REC);
	for (int i = 0; readonly_dirs[i]; i++)
		bind_ro(readonly_dirs[i], readonly_dirs[i], MS_REC);
	if (cgroups)
		mount_cgroups(conf("cgroup_skel", len), cgroups);
	char *views = (char *)conf("views", len);
	if (views)
		bind_views(views);
	if (sys_tree_ro && setattr_ro("sys", AT_RECURSIVE_FLAG) < 0)
		die("mount_setattr", "sys tree");

	if (stage) {
		root_on_stage();
		if (agent_exe && userns_fd < 0)
			adopt_exe();
	} else {
		/* pivot_root(".", ".") stacks the old root on top of the new
		 * one; detaching it leaves only the sandbox's own mounts here. */
		if (syscall(SYS_pivot_root, ".", ".") < 0)
			die("pivot_root", NULL);
		if (umount2(".", MNT_DETACH) < 0)
			die("detach old root", NULL);
	}
	if (chdir("/") < 0)
		die("chdir", "/");
	/* In the user-namespace mode the UTS namespace is made after the
	 * join (userns_namespaces), and named there. */
	if (hostname && userns_fd < 0 && sethostname(hostname, strlen(hostname)) < 0)
		die("sethostname", hostname);
	if (!netns)
		loopback_up();
	const char *rlimits = conf("rlimits", len);
	if (rlimits)
		apply_rlimits(rlimits);
	/* Before drop_caps: setting it needs CAP_AUDIT_CONTROL, which the
	 * sandbox then lacks, so no process of it can change it. */
	const char *auid = conf("auid", len);
	if (auid) {
		int fd = open("/proc/self/loginuid", O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, auid, strlen(auid)) < 0)
			die("set loginuid", auid);
		close(fd);
	}
	if (userns_fd >= 0) {
		join_userns();
		userns_namespaces(hostname, agent_exe != NULL);
	}
	drop_caps();
	/* no_new_privs=0: the sandbox asked for setuid binaries to work. The
	 * filters then install on CAP_SYS_ADMIN, which we still hold. */
	const char *nnp = conf("no_new_privs", len);
	if ((!nnp || strcmp(nnp, "0")) && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		die("prctl", "no_new_privs");
	/* The default filter, then the audit filter on top of it: where both
	 * refuse, the newer one decides, so the kernel logs exactly the
	 * deliberate refusals (internal/seccomp AuditPolicy). */
	const char *seccomp = conf("seccomp", len), *audit = conf("seccomp_audit", len);
	if (seccomp)
		install_seccomp(seccomp, 0);
	if (audit)
		install_seccomp(audit, SECCOMP_FILTER_FLAG_LOG);
	if (userns_base)
		drop_sys_admin();
	unsetenv(INIT_ENV);
	/* Closing the status pipe tells the daemon the sandbox is up. */
	close(FD_STATUS);
	finish_userns();
	/* The config's pages would stay with PID 1 for good. */
	madvise(config, sizeof config, MADV_DONTNEED);
	warren_agent_start(FD_LISTEN);
}

__attribute__((constructor)) static void warren_container_init(void)
{
	if (getenv(INIT_ENV))
		init_main();
}
