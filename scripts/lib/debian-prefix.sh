# Installs one Debian package of a later release (and its dependencies,
# libc included) into a private prefix, run through that release's own
# loader. Sourced by scripts/erofs-utils.sh and scripts/criu.sh, which set:
#
#   DP_NAME       the script's name (log prefix, manifest)
#   ROOT_PKG      the Debian package
#   DP_TOOLS      array of paths inside the package to wrap in $PREFIX/bin
#   DP_MAIN       the basename of the one that must work
#   DP_MAX_PKGS   refuse a dependency closure larger than this
#   PREFIX SUITE KEYRING APT_DIR  where, which suite, which keyring, which apt sources
#   DP_MIRROR     a mirror to use instead of the apt sources' (may be empty)
#   DP_MIRROR_VAR the environment variable that sets DP_MIRROR (for messages)
#   ERRFILE       where the last failure's reason is kept
#
# and define usable BIN (0 when BIN is a working install), usable_why BIN
# (what is wrong with it) and installed_version BIN. Arguments: "$@" of the
# caller: --force installs again, --mirrors prints the mirrors it would try.
#
# What it does: takes the Debian mirror from this system's apt sources
# (/etc/apt/sources.list, sources.list.d/*.list and deb822 *.sources),
# fetches the suite's InRelease and checks its signature with gpgv against
# the Debian archive keyring, takes the Packages index whose SHA256 the
# signed Release lists, and from it resolves the package and its
# dependencies (libc6 and the libraries, recursively: nothing is taken from
# the host) and checks every .deb's SHA256 and size. The .debs are unpacked
# with dpkg-deb -x (no maintainer scripts, nothing registered with dpkg)
# into $PREFIX, and $PREFIX/bin/TOOL exec the binaries through the suite's
# own dynamic loader and libraries (ld.so --inhibit-cache --library-path),
# so the host's libc is never mixed in.

log() { echo "$DP_NAME: $*" >&2; }
fail() {
  log "$*"
  if mkdir -p "$(dirname "$PREFIX")" 2>/dev/null; then
    printf '%s: %s\n' "$(date -u +%FT%TZ)" "$*" >"$ERRFILE" 2>/dev/null || true
  fi
  exit 1
}

force=0 mode=install
case "${1:-}" in
  --force) force=1 ;;
  --mirrors) mode=mirrors ;;
  "") ;;
  *) echo "usage: $0 [--force|--mirrors]" >&2; exit 2 ;;
esac

ARCH=$(dpkg --print-architecture)
CODENAME=$( (. /etc/os-release && echo "${VERSION_CODENAME:-}") 2>/dev/null || true)

# apt_mirrors prints the URIs of the system's "deb" sources for main, those
# of the system's own suite first; one per line, no trailing slash.
apt_mirrors() {
  local files=() f
  [ -f "$APT_DIR/sources.list" ] && files+=("$APT_DIR/sources.list")
  for f in "$APT_DIR"/sources.list.d/*.list "$APT_DIR"/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  ((${#files[@]})) || return 0
  awk -v want="$CODENAME" '
    function emit(types, uris, suites, comps,   nt, t, nu, u, ns, s, nc, c, isdeb, hasmain, own, i, j) {
      nt = split(types, t, /[ \t]+/); isdeb = 0
      for (i = 1; i <= nt; i++) if (t[i] == "deb") isdeb = 1
      nc = split(comps, c, /[ \t]+/); hasmain = 0
      for (i = 1; i <= nc; i++) if (c[i] == "main") hasmain = 1
      if (!isdeb || !hasmain) return
      ns = split(suites, s, /[ \t]+/); own = 0
      for (i = 1; i <= ns; i++) if (s[i] == want) own = 1
      nu = split(uris, u, /[ \t]+/)
      for (j = 1; j <= nu; j++) {
        if (u[j] !~ /^(https?|file):/) continue
        sub(/\/+$/, "", u[j])
        print (own ? 0 : 1) "\t" u[j]
      }
    }
    function flush() {
      if (para && tolower(f["enabled"]) != "no") emit(f["types"], f["uris"], f["suites"], f["components"])
      delete f; para = 0; last = ""
    }
    FNR == 1 { flush(); deb822 = (FILENAME ~ /\.sources$/) }
    deb822 {
      if ($0 ~ /^#/) next
      if ($0 ~ /^[ \t]*$/) { flush(); next }
      if ($0 ~ /^[ \t]/) { if (last != "") f[last] = f[last] " " $0; next }
      k = $0; sub(/:.*/, "", k); v = $0; sub(/^[^:]*:[ \t]*/, "", v)
      last = tolower(k); f[last] = v; para = 1
      next
    }
    {
      line = $0; sub(/#.*/, "", line)
      gsub(/\[[^]]*\]/, " ", line)
      n = split(line, w, /[ \t]+/)
      k = 0; for (i = 1; i <= n; i++) if (w[i] != "") x[++k] = w[i]
      if (k >= 4) { comps = x[4]; for (i = 5; i <= k; i++) comps = comps " " x[i]; emit(x[1], x[2], x[3], comps) }
      delete x
    }
    END { flush() }
  ' "${files[@]}" | sort -s -t "$(printf '\t')" -k1,1 | cut -f2 | awk '!seen[$0]++'
}

if [ "$mode" = mirrors ]; then
  apt_mirrors
  exit 0
fi

if [ "$mode" = install ] && [ "$force" = 0 ] && usable "$PREFIX/bin/$DP_MAIN"; then
  rm -f "$ERRFILE"
  exit 0
fi
[ "$(id -u)" = 0 ] || fail "must run as root to install into $PREFIX"
for c in curl gpgv dpkg-deb dpkg sha256sum awk; do
  command -v "$c" >/dev/null || fail "$c is needed (apt-get install curl gpgv dpkg)"
done
[ -r "$KEYRING" ] || fail "no Debian archive keyring at $KEYRING (apt-get install debian-archive-keyring)"

mkdir -p "$(dirname "$PREFIX")"
# One install at a time.
exec 9>"$PREFIX.lock"
if command -v flock >/dev/null; then flock 9; fi
if [ "$force" = 0 ] && usable "$PREFIX/bin/$DP_MAIN"; then
  rm -f "$ERRFILE"
  exit 0
fi

tmp=$(mktemp -d)
staging=""
cleanup() {
  rm -rf "$tmp"
  [ -n "$staging" ] && rm -rf "$staging"
  return 0
}
trap cleanup EXIT

fetch() { # URL FILE
  curl -fsSL --retry 3 --connect-timeout 20 --max-time 600 -o "$2" "$1"
}

# Find a mirror that has the suite, with a valid signature.
if [ -n "${DP_MIRROR:-}" ]; then
  mirrors=("${DP_MIRROR%/}")
else
  mapfile -t mirrors < <(apt_mirrors)
fi
((${#mirrors[@]})) || fail "no Debian mirror in the apt sources ($APT_DIR/sources.list, $APT_DIR/sources.list.d); set $DP_MIRROR_VAR"
MIRROR="" why=""
for m in "${mirrors[@]}"; do
  if ! fetch "$m/dists/$SUITE/InRelease" "$tmp/InRelease" 2>"$tmp/curl.err"; then
    why="$why; $m has no $SUITE ($(tail -n1 "$tmp/curl.err"))"
    continue
  fi
  if ! gpgv --keyring "$KEYRING" --output "$tmp/Release" "$tmp/InRelease" 2>"$tmp/gpgv.err"; then
    why="$why; $m/dists/$SUITE/InRelease: bad signature ($(grep -m1 -iE 'bad|no public key|error' "$tmp/gpgv.err" || tail -n1 "$tmp/gpgv.err"))"
    continue
  fi
  MIRROR=$m
  break
done
[ -n "$MIRROR" ] || fail "no usable $SUITE mirror${why}"
log "using $MIRROR $SUITE ($ARCH)"

# The Packages index, checked against the signed Release (SHA256 section).
release_sum() { # PATH -> "sha256 size"
  awk -v p="$1" '/^[A-Za-z0-9-]+:/ { sec = $1 } sec == "SHA256:" && $3 == p { print $1, $2; exit }' "$tmp/Release"
}
idx="" sum=""
for ext in xz gz; do
  [ "$ext" = xz ] && ! command -v xz >/dev/null && continue
  sum=$(release_sum "main/binary-$ARCH/Packages.$ext")
  if [ -n "$sum" ]; then idx="main/binary-$ARCH/Packages.$ext"; break; fi
done
[ -n "$idx" ] || fail "$MIRROR $SUITE: the signed Release lists no main/binary-$ARCH/Packages.{xz,gz}"
check() { # FILE "sha256 size" WHAT
  local want_sum=${2%% *} want_size=${2##* } got_sum got_size
  got_size=$(stat -c %s "$1")
  got_sum=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got_sum" = "$want_sum" ] && [ "$got_size" = "$want_size" ] ||
    fail "$3: SHA256 mismatch (got $got_sum, $got_size bytes; want $want_sum, $want_size bytes)"
}
fetch "$MIRROR/dists/$SUITE/$idx" "$tmp/Packages.${idx##*.}" || fail "downloading $MIRROR/dists/$SUITE/$idx failed"
check "$tmp/Packages.${idx##*.}" "$sum" "$idx"
case "$idx" in
  *.xz) xz -dc "$tmp/Packages.xz" >"$tmp/Packages" ;;
  *.gz) gzip -dc "$tmp/Packages.gz" >"$tmp/Packages" ;;
esac

# One line per package: name version filename sha256 size deps (Pre-Depends
# and Depends, comma-separated, alternatives with "|").
awk '
  function out() { if (p != "") print p "\t" v "\t" fn "\t" sh "\t" sz "\t" dep; p = v = fn = sh = sz = dep = "" }
  /^$/ { out(); next }
  /^Package: / { p = $2 }
  /^Version: / { v = $2 }
  /^Filename: / { fn = $2 }
  /^SHA256: / { sh = $2 }
  /^Size: / { sz = $2 }
  /^(Pre-)?Depends: / { d = $0; sub(/^[^:]*: /, "", d); dep = (dep == "" ? d : dep ", " d) }
  END { out() }
' "$tmp/Packages" >"$tmp/index"

declare -A want=()
queue=("$ROOT_PKG")
while ((${#queue[@]})); do
  p=${queue[0]}
  queue=("${queue[@]:1}")
  [ -n "${want[$p]:-}" ] && continue
  line=$(awk -F'\t' -v p="$p" '$1 == p { print; exit }' "$tmp/index")
  [ -n "$line" ] || fail "$SUITE has no package $p (needed by $ROOT_PKG)"
  want[$p]=$line
  deps=$(printf '%s\n' "$line" | cut -f6)
  IFS=',' read -ra alts <<<"$deps"
  for a in "${alts[@]}"; do
    chosen=""
    IFS='|' read -ra opts <<<"$a"
    for o in "${opts[@]}"; do
      name=$(printf '%s\n' "$o" | sed -E 's/\(.*\)//; s/:[a-z0-9]+//; s/[[:space:]]//g')
      [ -n "$name" ] || continue
      if awk -F'\t' -v p="$name" '$1 == p { f = 1; exit } END { exit !f }' "$tmp/index"; then chosen=$name; break; fi
    done
    [ -n "$chosen" ] || fail "$SUITE: cannot resolve dependency '$a' of $p"
    queue+=("$chosen")
  done
  ((${#want[@]} <= DP_MAX_PKGS)) || fail "$ROOT_PKG pulls in more than $DP_MAX_PKGS packages from $SUITE; refusing"
done

staging=$(mktemp -d "$PREFIX.new.XXXXXX")
manifest="$staging/MANIFEST"
{
  echo "# $ROOT_PKG for Warren, installed by scripts/$DP_NAME.sh"
  echo "mirror $MIRROR"
  echo "suite $SUITE"
  echo "arch $ARCH"
} >"$manifest"
for p in $(printf '%s\n' "${!want[@]}" | sort); do
  IFS=$'\t' read -r name ver fn sh sz _ <<<"${want[$p]}"
  deb="$tmp/$(basename "$fn")"
  fetch "$MIRROR/$fn" "$deb" || fail "downloading $MIRROR/$fn failed"
  check "$deb" "$sh $sz" "$fn"
  dpkg-deb -x "$deb" "$staging" || fail "dpkg-deb -x $fn failed"
  echo "package $name $ver $sh" >>"$manifest"
done

# The loader and library directory of the unpacked libc6.
libc=$(find "$staging" -name libc.so.6 \( -type f -o -type l \) | sort | head -n1)
[ -n "$libc" ] || fail "the unpacked libc6 has no libc.so.6"
libdir=$(dirname "$libc")
loader=""
for l in "$staging"/usr/lib64/ld-linux*.so.* "$staging"/lib64/ld-linux*.so.* "$staging"/usr/lib/ld-linux*.so.* "$staging"/lib/ld-linux*.so.* "$libdir"/ld-linux*.so.*; do
  if [ -e "$l" ]; then loader=$l; break; fi
done
[ -n "$loader" ] || fail "the unpacked libc6 has no dynamic loader"
main_rel=""
for t in "${DP_TOOLS[@]}"; do
  if [ "$(basename "$t")" = "$DP_MAIN" ]; then main_rel=$t; fi
done
[ -n "$main_rel" ] && [ -x "$staging/$main_rel" ] || fail "the unpacked $ROOT_PKG has no $DP_MAIN"

# Every library must resolve inside the prefix.
if ! "$loader" --inhibit-cache --library-path "$libdir" --list "$staging/$main_rel" >"$tmp/list" 2>&1; then
  fail "$DP_MAIN does not load with $SUITE's loader: $(tail -n3 "$tmp/list")"
fi
if grep '=>' "$tmp/list" | grep -v "=> $staging/" | grep -q .; then
  fail "$DP_MAIN needs libraries from outside $PREFIX: $(grep '=>' "$tmp/list" | grep -v "=> $staging/" | tr '\n' ' ')"
fi

# Wrappers with the final paths.
final_loader=$PREFIX${loader#"$staging"}
final_libdir=$PREFIX${libdir#"$staging"}
mkdir -p "$staging/bin"
for rel in "${DP_TOOLS[@]}"; do
  [ -x "$staging/$rel" ] || continue
  tool=$(basename "$rel")
  cat >"$staging/bin/$tool" <<EOF
#!/bin/sh
# $tool from Debian $SUITE ($(awk '$1 == "package" && $2 == "'"$ROOT_PKG"'" { print $3 }' "$manifest")), run with its own loader and
# libraries; installed by Warren's scripts/$DP_NAME.sh.
unset LD_PRELOAD LD_LIBRARY_PATH
exec $final_loader --inhibit-cache --library-path $final_libdir --argv0 $tool $PREFIX/$rel "\$@"
EOF
  chmod 0755 "$staging/bin/$tool"
done
chmod 0755 "$staging"

# Swap it in.
old=""
if [ -e "$PREFIX" ]; then
  old=$(mktemp -d "$PREFIX.old.XXXXXX")
  rmdir "$old"
  mv "$PREFIX" "$old"
fi
mv "$staging" "$PREFIX"
staging=""
[ -n "$old" ] && rm -rf "$old"

usable "$PREFIX/bin/$DP_MAIN" || fail "$PREFIX/bin/$DP_MAIN does not work: $(usable_why "$PREFIX/bin/$DP_MAIN")"
rm -f "$ERRFILE"
log "installed $(installed_version "$PREFIX/bin/$DP_MAIN") in $PREFIX ($(grep -c '^package ' "$PREFIX/MANIFEST") packages from $SUITE)"
