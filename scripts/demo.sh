#!/usr/bin/env bash
# The main job on its embedded default: builds warren, starts the node
# daemon (unless one already answers), builds the default image (Debian
# bookworm with python3 and git, from Debian's packages via debootstrap;
# --busybox for a seconds-fast busybox image instead) and walks one sandbox
# through its life. The daemon is left running; the last line says how to
# stop it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (namespaces, mounts, cgroups)" >&2; exit 1; }
kind=debian
[ "${1:-}" = "--busybox" ] && kind=busybox
./scripts/deps.sh
make -s build
W=bin/warren
SOCK=${WARREN_SOCKET:-/run/warren/warren.sock}
export WARREN_ADDR=unix://$SOCK
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if ! $W sandbox ls >/dev/null 2>&1; then
  step "starting the daemon (log: /var/log/warren.log)"
  mkdir -p /var/log
  nohup $W serve --socket "$SOCK" >>/var/log/warren.log 2>&1 &
  echo $! > /run/warren-demo.pid
  for _ in $(seq 100); do $W sandbox ls >/dev/null 2>&1 && break; sleep 0.1; done
fi
$W version

img=default
[ "$kind" = busybox ] && img=busybox
if ! $W image ls | awk 'NR>1{print $1}' | grep -qx "$img"; then
  msg=""; [ "$kind" = debian ] && msg=" (debootstrap takes a minute or two)"
  step "building the $kind image '$img'$msg"
  $W image build "$kind" "$img"
fi
$W image ls

step "create a sandbox"
id=$($W sandbox create --image "$img" --label demo=1 --memory 512Mi --cpu 1 --pids 512 --timeout 10m --workdir /root)
$W sandbox get "$id"

step "exec: who and where am I"
$W sandbox exec "$id" -- sh -c 'id; hostname; cat /etc/os-release 2>/dev/null | head -1; ip addr 2>/dev/null | grep -c inet || true'

if [ "$kind" = debian ]; then
  step "exec: python3 and git"
  $W sandbox exec "$id" -- python3 -c 'import sys; print("python", sys.version.split()[0])'
  $W sandbox exec --shell 'mkdir -p /root/repo && cd /root/repo && git init -q && echo "print(2+2)" > main.py && git add . && git -c user.email=a@b -c user.name=agent commit -qm init && git log --oneline && python3 main.py' "$id"
fi

step "files: copy a file in, read it back"
tmp=$(mktemp -d)
echo "hello from the host" > "$tmp/hello.txt"
$W sandbox cp "$tmp/hello.txt" "$id:/root/hello.txt"
$W sandbox exec "$id" -- cat /root/hello.txt

step "streaming exec"
$W sandbox exec --stream --shell 'for i in 1 2 3; do echo tick $i; sleep 0.3; done' "$id"

step "limits: output cap and timeout"
$W sandbox exec --output-limit 32 --shell 'yes | head -c 3000000' "$id"
$W sandbox exec --timeout 1s --shell 'sleep 5' "$id" || echo "(exit $?: timed out as asked)"

step "delete"
$W sandbox rm "$id"
$W sandbox ls
rm -rf "$tmp"
echo
echo "The daemon keeps running: $W --addr $WARREN_ADDR sandbox ls"
[ -f /run/warren-demo.pid ] && echo "Stop it with: kill \$(cat /run/warren-demo.pid)"
