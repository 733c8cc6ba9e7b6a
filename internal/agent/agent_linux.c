//go:build ignore

/*
 * warren-init: the PID 1 of every sandbox. It reaps zombies and starts
 * processes on request from the host. It runs from an ELF constructor of
 * the standalone agent binary (internal/agentbin/build.sh; no Go build
 * compiles this file), so an idle agent costs a few pages instead of a Go
 * heap and its threads. See doc.go for the wire protocol.
 *
 * Design: single-threaded epoll loop over the listening socket, a
 * signalfd for SIGCHLD, one socket per client connection and, while a
 * process is starting, the read end of its exec-status pipe. Memory is a
 * small malloc'd record per connection plus the EXEC payload until fork.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>

#define AGENT_ENV "_WARREN_AGENT_FD"
#define PROTO_VERSION 3
#define MAX_PAYLOAD (4u << 20)
#define HDR_LEN 5
#define INLINE_PAYLOAD 64 /* PING and SIGNAL frames never touch malloc */
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* EXEC flags beyond the three stdio bits (see doc.go). */
#define F_DETACH 8u
#define F_PTY 16u
#define DETACH_HDR 16 /* u32 cap, u32 rows, u32 cols, u32 taglen */
#define MAX_TAG 3072
#define MAX_CAP (64u << 20)
/* Records held at once, running or exited: a backstop against a runaway
 * client, above what the daemon keeps (MaxProcessesPerSandbox running plus
 * MaxExitedProcesses exited, 1,280) with room for FORGETs in flight. */
#define MAX_BPROCS 2048
#define CHUNK (32u << 10)
#define OUT_HDR (HDR_LEN + 9) /* 'O' frame: u8 stream, u64 offset */
#define FROM_END UINT64_MAX

enum { W_LISTEN, W_SIGNAL, W_SOCK, W_PIPE, W_OUT, W_ERR };
enum { C_IDLE, C_STARTING, C_RUNNING, C_DETACHED, C_ATTACHED, C_LISTING };

struct conn;
struct bproc;

/* What an epoll event points at; a conn embeds one per fd it watches. */
struct watch {
	int kind;
	struct conn *c;
	struct bproc *bp;
};

/* One output stream of a background process: the bytes [start, total)
 * of its absolute offsets, at buf[off % size]. The buffer grows by
 * doubling while the stream is short and wraps once it holds cap bytes,
 * so it keeps the latest cap bytes and costs nothing until written. */
struct ring {
	uint8_t *buf;
	uint32_t size;
	uint64_t start, total;
	int fd; /* read end, -1 after EOF */
};

/* A background process (EXEC with F_DETACH): the agent owns its stdio,
 * drains its output with or without a client, and keeps its record and
 * output after it exits, for any number of later clients. */
struct bproc {
	struct watch wout, werr;
	pid_t pid;
	uint32_t seq;
	int reaped, status, pty;
	int infd;          /* stdin write end (a dup of the master with a pty), -1 once closed */
	uint32_t cap;      /* per stream */
	uint64_t start_ms, run_ms;
	struct ring out, err;
	struct conn *att;   /* attached clients, linked through anext */
	struct bproc *next; /* in start order */
	int forgotten;      /* FORGET unlisted it; freed once att is empty */
	struct bproc *dnext; /* on dead_bprocs */
	uint32_t taglen;
	uint8_t tag[MAX_TAG];
};

struct conn {
	struct watch wsock, wpipe;
	int fd;      /* client socket, -1 once closed */
	int pipefd;  /* exec-status pipe while C_STARTING, else -1 */
	int ptm;     /* pty master of a connection's process until STARTED, else -1 */
	pid_t pid;   /* 0 until forked */
	int state;
	int reaped, status, released;
	int bad;     /* protocol violation seen while receiving fds */
	/* frame being received */
	uint8_t hdr[HDR_LEN];
	uint32_t hgot, plen, pgot;
	uint8_t *payload;
	uint8_t inl[INLINE_PAYLOAD];
	int fds[3], nfds; /* SCM_RIGHTS fds received with the frame */
	struct bproc *bp;  /* C_STARTING detached: its record, not yet listed;
			    * C_ATTACHED: the process followed; C_LISTING: the
			    * last one sent */
	uint64_t cur[2];   /* C_ATTACHED: next offsets of stdout, stderr */
	uint8_t *pend;     /* frame being sent (CHUNK + OUT_HDR bytes) */
	uint32_t plen_out, psent;
	int wantout;       /* EPOLLOUT is armed */
	int linked;        /* on bp->att */
	struct conn *anext, *aprev;
	struct conn *prev, *next; /* all live conns, for pid lookup */
	struct conn *dead;        /* freed at the end of an epoll batch */
};

/* Sent by the child through the CLOEXEC pipe when a setup step fails. */
struct child_err {
	int32_t err;
	char step[12];
};

static int epfd = -1, lfd = -1, sfd = -1;
static struct watch wlisten = {W_LISTEN, NULL, NULL}, wsignal = {W_SIGNAL, NULL, NULL};
static struct conn *conns, *dead_conns;
static struct bproc *bprocs, *bprocs_tail;
static struct bproc *dead_bprocs; /* forgotten, freed at the end of an epoll batch */
static uint32_t nbprocs;
static uint32_t nrunning;
static int listen_paused;
static struct rlimit orig_nofile;
static int have_nofile;
/* Limits the programs get but the agent does not (the container init
 * stage passes them: internal/container/init_linux.c, apply_rlimits). */
#define CHILD_RLIMITS_ENV "_WARREN_CHILD_RLIMITS"
static struct {
	int res;
	struct rlimit r;
} child_rlimits[16];
static int nchild_rlimits;

static void fatal(const char *what)
{
	/* The only output the agent ever writes: it is about to die. */
	const char *e = strerror(errno);
	struct iovec iov[] = {
		{(void *)"warren-init: ", 13}, {(void *)what, strlen(what)},
		{(void *)": ", 2},            {(void *)e, strlen(e)},
		{(void *)"\n", 1},
	};
	(void)!writev(2, iov, 5);
	_exit(1);
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = v;
	p[1] = v >> 8;
	p[2] = v >> 16;
	p[3] = v >> 24;
}

static uint32_t get32(const uint8_t *p)
{
	return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Where an EXEC payload's strings begin: after the background-process
 * header and tag when F_DETACH is set. */
static uint32_t strings_off(const uint8_t *p)
{
	return get32(p) & (F_DETACH | F_PTY) ? 20 + DETACH_HDR + get32(p + 20 + 12) : 20;
}

/* ---- allocation ------------------------------------------------------- */

#ifdef WARREN_AGENT_MAIN
/* The standalone agent never calls malloc. musl's allocator reads the aux
 * vector, which lives on the kernel's stack that the agent unmaps, and it
 * mmaps its groups near the top of the address space, where any live
 * mapping keeps three page-table pages (12 KiB) of its own. Connection
 * records come from brk, right after the .bss (move_mm), and are reused;
 * payloads and a child's argument vectors are mmaps of their own, unmapped
 * with their page tables as soon as they are done with. */
static struct conn *free_conns; /* linked through ->dead */
static uintptr_t brk_end;

static struct conn *conn_alloc(void)
{
	if (!free_conns) {
		uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
		if (!brk_end)
			brk_end = (uintptr_t)syscall(SYS_brk, 0);
		uintptr_t want = brk_end + pg;
		if ((uintptr_t)syscall(SYS_brk, want) < want)
			return NULL;
		for (uintptr_t off = 0; off + sizeof(struct conn) <= pg; off += sizeof(struct conn)) {
			struct conn *c = (struct conn *)(brk_end + off);
			c->dead = free_conns;
			free_conns = c;
		}
		brk_end = want;
	}
	struct conn *c = free_conns;
	free_conns = c->dead;
	memset(c, 0, sizeof(*c));
	return c;
}

static void conn_free(struct conn *c)
{
	if (c) {
		c->dead = free_conns;
		free_conns = c;
	}
}

static void *big_alloc(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void big_free(void *p, size_t n) { munmap(p, n); }
#else
static struct conn *conn_alloc(void) { return calloc(1, sizeof(struct conn)); }
static void conn_free(struct conn *c) { free(c); }
static void *big_alloc(size_t n) { return malloc(n); }
static void big_free(void *p, size_t n)
{
	(void)n;
	free(p);
}
#endif

/* ---- replies ---------------------------------------------------------- */

/* Replies are tiny; a full socket buffer means the client stopped reading,
 * which we treat as a broken connection rather than buffering. */
static int send_frame(struct conn *c, uint8_t type, const uint8_t *p, uint32_t n)
{
	uint8_t buf[HDR_LEN + 32];
	if (c->fd < 0 || n > sizeof(buf) - HDR_LEN)
		return -1;
	put32(buf, n);
	buf[4] = type;
	memcpy(buf + HDR_LEN, p, n);
	ssize_t w = send(c->fd, buf, HDR_LEN + n, MSG_NOSIGNAL | MSG_DONTWAIT);
	return w == (ssize_t)(HDR_LEN + n) ? 0 : -1;
}

static void send_failed(struct conn *c, int err, const char *step)
{
	uint8_t p[4 + sizeof(((struct child_err *)0)->step)];
	size_t n = strnlen(step, sizeof(p) - 5);
	put32(p, (uint32_t)err);
	memcpy(p + 4, step, n);
	p[4 + n] = 0;
	send_frame(c, 'F', p, 4 + n + 1);
}

/* ---- connection lifecycle --------------------------------------------- */

static void resume_listen(void)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &wlisten};
	if (listen_paused && epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev) == 0)
		listen_paused = 0;
}

static void close_fds(struct conn *c)
{
	for (int i = 0; i < c->nfds; i++)
		close(c->fds[i]);
	c->nfds = 0;
}

static void reset_frame(struct conn *c)
{
	if (c->payload && c->payload != c->inl)
		big_free(c->payload, c->plen);
	c->payload = NULL;
	c->hgot = c->plen = c->pgot = 0;
	close_fds(c);
	c->bad = 0;
}

/* Unlink now, free after the epoll batch: later events of the same batch
 * may still point at this conn (they see fd == -1 and skip it). */
static void release(struct conn *c)
{
	if (c->released)
		return;
	c->released = 1;
	if (c->prev)
		c->prev->next = c->next;
	else
		conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->dead = dead_conns;
	dead_conns = c;
}

/* Stop watching fd, then close it. close() alone does not remove an epoll
 * registration while another process holds the same open file: a child
 * between fork and exec has a copy of every fd, so events could still
 * arrive for a conn that has since been freed. */
static void unwatch_close(int *fd)
{
	epoll_ctl(epfd, EPOLL_CTL_DEL, *fd, NULL);
	close(*fd);
	*fd = -1;
}

/* Close the client side of c. kill_it: the client can no longer observe
 * the process, so it dies with its process group (cancellation = close).
 * The record stays until the process is reaped, to keep the pid known. */
static void bproc_discard(struct bproc *bp);

static void drop(struct conn *c, int kill_it)
{
	if (c->fd >= 0)
		unwatch_close(&c->fd);
	if (c->pipefd >= 0)
		unwatch_close(&c->pipefd);
	if (c->ptm >= 0) {
		close(c->ptm);
		c->ptm = -1;
	}
	reset_frame(c);
	if (c->pend) {
		big_free(c->pend, CHUNK + OUT_HDR);
		c->pend = NULL;
	}
	if (c->state == C_STARTING && c->bp) {
		bproc_discard(c->bp); /* never listed: nobody else knows it */
		c->bp = NULL;
	}
	if (c->linked) {
		if (c->aprev)
			c->aprev->anext = c->anext;
		else
			c->bp->att = c->anext;
		if (c->anext)
			c->anext->aprev = c->aprev;
		c->linked = 0;
		/* The last reader of a forgotten record lets it go. */
		if (c->bp->forgotten && !c->bp->att) {
			c->bp->dnext = dead_bprocs;
			dead_bprocs = c->bp;
		}
	}
	if (c->state == C_ATTACHED || c->state == C_LISTING || c->state == C_IDLE)
		c->bp = NULL;
	if (c->pid > 0 && !c->reaped) {
		if (kill_it) {
			kill(-c->pid, SIGKILL);
			/* before setsid() in the child there is no group yet */
			kill(c->pid, SIGKILL);
		}
	} else {
		release(c);
	}
	resume_listen();
}

/* Discard unread input before close: unread data makes close() reset the
 * peer, and it may carry fds that would otherwise stay in flight. */
static void drain(int fd)
{
	static uint8_t buf[4096];
	char cbuf[CMSG_SPACE(sizeof(int) * 4)];
	for (int i = 0; i < 16; i++) {
		struct iovec iov = {buf, sizeof(buf)};
		struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1,
				   .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
		if (recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) <= 0)
			return;
		for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
			if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
				continue;
			int *fds = (int *)CMSG_DATA(h);
			for (size_t k = 0; k < (h->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++)
				close(fds[k]);
		}
	}
}

static void fail(struct conn *c, int err, const char *step)
{
	send_failed(c, err, step);
	if (c->fd >= 0)
		drain(c->fd);
	drop(c, 1);
}

static void send_exited(struct conn *c)
{
	uint8_t p[8];
	int st = c->status;
	put32(p, WIFEXITED(st) ? (uint32_t)WEXITSTATUS(st) : (uint32_t)-1);
	put32(p + 4, WIFSIGNALED(st) ? (uint32_t)WTERMSIG(st) : 0);
	send_frame(c, 'X', p, sizeof(p));
	if (c->fd >= 0)
		drain(c->fd);
}

static void bproc_publish(struct bproc *bp, struct conn *c);
static int send_fd(struct conn *c, int fd, pid_t pid);

/* The exec-status pipe has data (a setup step failed) or EOF (exec
 * succeeded, or the child died, which reap() handles). */
static void finish_start(struct conn *c)
{
	struct child_err ce;
	ssize_t n = read(c->pipefd, &ce, sizeof(ce));
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	unwatch_close(&c->pipefd);
	if (n != 0) {
		if (n != (ssize_t)sizeof(ce)) {
			ce.err = n < 0 ? errno : EIO;
			strcpy(ce.step, "exec");
		}
		ce.step[sizeof(ce.step) - 1] = 0;
		send_failed(c, ce.err, ce.step);
		drop(c, 1);
		return;
	}
	uint8_t p[4];
	put32(p, (uint32_t)c->pid);
	if (c->bp) {
		/* From now on the process is the agent's, not the client's. */
		struct bproc *bp = c->bp;
		c->bp = NULL;
		c->state = C_DETACHED;
		bproc_publish(bp, c);
		c->pid = 0; /* the pid is the bproc's now */
		send_frame(c, 'R', p, 4);
		drain(c->fd);
		drop(c, 0);
		return;
	}
	c->state = C_RUNNING;
	if (c->ptm >= 0) {
		/* The client reads and writes the terminal itself. */
		int ok = send_fd(c, c->ptm, c->pid) == 0;
		close(c->ptm);
		c->ptm = -1;
		if (!ok)
			drop(c, 1);
		return;
	}
	if (send_frame(c, 'R', p, 4) < 0)
		drop(c, 1);
}

static void bproc_reaped(pid_t pid, int st);

static void reaped(pid_t pid, int st);

static void reap(void)
{
	struct signalfd_siginfo si;
	while (read(sfd, &si, sizeof(si)) == sizeof(si))
		;
	for (;;) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);
		if (pid <= 0)
			return;
		reaped(pid, st);
	}
}

/* The bookkeeping of a reaped child: a connection's process, a background
 * process, or an orphan reparented to us. */
static void reaped(pid_t pid, int st)
{
	struct conn *c = conns;
	while (c && !(c->pid == pid && c->state != C_DETACHED && !c->reaped))
		c = c->next;
	if (!c) {
		bproc_reaped(pid, st); /* or an orphan reparented to us */
		return;
	}
	nrunning--;
	c->reaped = 1;
	c->status = st;
	if (c->pipefd >= 0)
		finish_start(c); /* the child is gone: read cannot block */
	if (c->fd >= 0 && c->state == C_RUNNING)
		send_exited(c);
	drop(c, 0);
}

/* ---- child ------------------------------------------------------------ */

static void __attribute__((noreturn)) child_fail(int errfd, const char *step)
{
	struct child_err ce = {.err = errno};
	strncpy(ce.step, step, sizeof(ce.step) - 1);
	(void)!write(errfd, &ce, sizeof(ce));
	_exit(127);
}

static const char *env_path(char **envp)
{
	for (; *envp; envp++)
		if (strncmp(*envp, "PATH=", 5) == 0)
			return *envp + 5;
	return DEFAULT_PATH;
}

/* execvpe() semantics, but with PATH from the request env, and without
 * the /bin/sh fallback on ENOEXEC (the client gets a clear error). */
static void __attribute__((noreturn, noinline)) exec_path(char **argv, char **envp, int errfd)
{
	const char *file = argv[0];
	if (strchr(file, '/')) {
		execve(file, argv, envp);
		child_fail(errfd, "exec");
	}
	char buf[4096];
	size_t flen = strlen(file);
	int eacces = 0;
	for (const char *p = env_path(envp);; p++) {
		const char *end = strchrnul(p, ':');
		size_t dlen = end - p;
		if (dlen + flen + 2 <= sizeof(buf)) {
			/* an empty PATH element means the working directory */
			size_t off = 0;
			if (dlen) {
				memcpy(buf, p, dlen);
				buf[dlen] = '/';
				off = dlen + 1;
			}
			memcpy(buf + off, file, flen + 1);
			execve(buf, argv, envp);
			switch (errno) {
			case EACCES:
				eacces = 1;
				break;
			case ENOENT: case ENOTDIR: case ESTALE: case ENODEV: case ETIMEDOUT:
				break;
			default:
				child_fail(errfd, "exec");
			}
		}
		if (!*end)
			break;
		p = end;
	}
	errno = eacces ? EACCES : ENOENT;
	child_fail(errfd, "exec");
}

/* close_range() needs Linux 5.9 and may be filtered by seccomp: fall back
 * to closing one by one up to the fd limit. A raw syscall: musl 1.2.3, which
 * builds the standalone agent, has no wrapper. */
static void close_between(unsigned int lo, unsigned int hi)
{
	if (lo > hi || syscall(SYS_close_range, lo, hi, 0) == 0)
		return;
	struct rlimit r;
	unsigned int max = 1u << 20; /* the kernel's default nr_open */
	if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < max)
		max = r.rlim_cur;
	for (unsigned int fd = lo; fd <= hi && fd < max; fd++)
		close(fd);
}

/* Runs in the forked child; never returns. Every step that can fail
 * reports (errno, step) on errfd, which the agent turns into FAILED. */
static void __attribute__((noreturn)) child(struct conn *c, int errfd)
{
	const uint8_t *p = c->payload;
	uint32_t flags = get32(p), argc = get32(p + 12), envc = get32(p + 16);
	if (flags & (F_DETACH | F_PTY))
		flags |= 7u; /* the agent made all three streams */
	uid_t uid = get32(p + 4);
	gid_t gid = get32(p + 8);

	/* The agent blocks everything; the program must start pristine. Its
	 * dispositions already are (warren_agent_main reset them once, and
	 * exec resets handlers): only the mask is left. */
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);

	/* errfd must survive the dup2s onto 0-2 below */
	if (errfd < 3 && (errfd = fcntl(errfd, F_DUPFD_CLOEXEC, 3)) < 0)
		_exit(127);

	/* Own session and group, so pgid == pid and group signals reach
	 * everything the program forks. */
	if (setsid() < 0)
		child_fail(errfd, "setsid");
	/* A pty becomes the new session's controlling terminal, so that ^C
	 * and SIGWINCH reach its foreground group. */
	if ((flags & F_PTY) && ioctl(c->fds[0], TIOCSCTTY, 0) < 0)
		child_fail(errfd, "pty");
	/* A user namespace with setgroups "deny" refuses this; fine if we
	 * already have no supplementary groups. */
	if (setgroups(0, NULL) < 0 && !(errno == EPERM && getgroups(0, NULL) == 0))
		child_fail(errfd, "setgroups");
	if (setgid(gid) < 0)
		child_fail(errfd, "setgid");
	if (setuid(uid) < 0)
		child_fail(errfd, "setuid");

	const char *cwd = (const char *)p + strings_off(p);
	if (chdir(*cwd ? cwd : "/") < 0)
		child_fail(errfd, "chdir");

	/* Standard streams. Passed fds first move above 2 so that dup2 onto
	 * 0-2 cannot clobber one another. */
	int src[3] = {-1, -1, -1};
	for (int i = 0, k = 0; i < 3; i++) {
		if (!(flags & (1u << i)))
			continue;
		src[i] = c->fds[k++];
		if (src[i] < 3 && (src[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 3)) < 0)
			child_fail(errfd, "stdio");
	}
	for (int i = 0; i < 3; i++) {
		if (src[i] >= 0) {
			if (dup2(src[i], i) < 0)
				child_fail(errfd, "stdio");
			continue;
		}
		int n = open("/dev/null", O_RDWR);
		if (n < 0) {
			close(i); /* no /dev/null in this root: leave the stream closed */
		} else if (n != i) {
			if (dup2(n, i) < 0)
				child_fail(errfd, "stdio");
			close(n);
		}
	}

	/* Everything else goes: the listen socket, signalfd, epoll fd, other
	 * clients' sockets and fds. Only errfd (CLOEXEC) stays until exec. */
	close_between(3, errfd - 1);
	close_between(errfd + 1, ~0u);

	/* The agent raised its own fd limit; the program gets the original,
	 * or the sandbox's limits where the agent keeps its own. */
	if (have_nofile)
		setrlimit(RLIMIT_NOFILE, &orig_nofile);
	for (int i = 0; i < nchild_rlimits; i++)
		if (setrlimit(child_rlimits[i].res, &child_rlimits[i].r) < 0)
			child_fail(errfd, "setrlimit");

	/* Strings were validated by the agent before fork. */
	char **argv = big_alloc((argc + 1) * sizeof(char *));
	char **envp = big_alloc((envc + 1) * sizeof(char *));
	if (!argv || !envp)
		child_fail(errfd, "memory");
	const char *s = cwd + strlen(cwd) + 1;
	for (uint32_t i = 0; i < argc; i++, s += strlen(s) + 1)
		argv[i] = (char *)s;
	argv[argc] = NULL;
	for (uint32_t i = 0; i < envc; i++, s += strlen(s) + 1)
		envp[i] = (char *)s;
	envp[envc] = NULL;
	exec_path(argv, envp, errfd);
}

/* ---- memory --------------------------------------------------------- */

/* Drop our mappings of the binary's read-only segments once startup is
 * over. The agent lives inside a multi-megabyte binary, and the kernel maps
 * 64 KiB around every page fault, so startup code (glibc init, ifunc
 * resolution) leaves ~1 MiB of text mapped that the loop never runs again.
 * The pages stay in the shared page cache; only our PTEs go, and the loop
 * faults back what it uses. Never applied to writable segments, whose
 * private copies MADV_DONTNEED would discard. */
static int trim_segments(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	(void)data;
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD || (ph->p_flags & PF_W))
			continue;
		uintptr_t start = (info->dlpi_addr + ph->p_vaddr) & ~(pg - 1);
		uintptr_t end = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
		madvise((void *)start, end - start, MADV_DONTNEED);
	}
	return 1; /* the main program is all there is in a static binary */
}

void __attribute__((noreturn)) warren_agent_main(int fd);

#ifdef WARREN_AGENT_MAIN
/* The standalone agent runs on a stack inside its own .bss rather than the
 * one the kernel set up near the top of the address space, unmaps that one
 * and moves the heap next to the .bss: with the vDSO gone as well, the
 * whole process fits under one page-table page per level (12 KiB, against
 * 28 KiB before). The first page of the stack is a guard, so an overflow
 * faults instead of overwriting data; the top holds the command line. */
#define OWN_STACK_SIZE (128u << 10)
#define CMDLINE "warren-init"
#define CMDLINE_ROOM 64
static char own_stack[OWN_STACK_SIZE] __attribute__((aligned(4096)));
/* In .data, whose page startup has already copied, rather than in a .bss
 * page of their own. */
#define IN_DATA __attribute__((section(".data")))
static uintptr_t kernel_sp IN_DATA; /* an address on the kernel's stack */
static char *empty_env[1] IN_DATA;
extern char _end[]; /* the linker's end of .bss */

static int on_own_stack(void)
{
	char here;
	return kernel_sp && (uintptr_t)&here - (uintptr_t)own_stack < sizeof own_stack;
}

/* Reads the given fields (1-based, ascending, all > 2) of /proc/self/stat.
 * The init stage uses it too (init_linux.c, set_exe). */
int warren_stat_fields(unsigned long *out, const int *which, int count)
{
	char buf[1024];
	int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	char *p = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
	if (!p)
		return -1;
	int i = 0;
	for (int field = 3; i < count && (p = strchr(p, ' ')); field++) {
		p++;
		if (field == which[i])
			out[i++] = strtoul(p, NULL, 10);
	}
	return i == count ? 0 : -1;
}

/* Before the kernel's stack goes: point the kernel's idea of our command
 * line at the copy on our stack (argv lived on the old one; ps and
 * /proc/1/cmdline read it, from anonymous memory only), and start the heap
 * at the next page after the .bss instead of at a random address in its
 * own 2 MiB (one more page-table page). PR_SET_MM_MAP needs no capability
 * for a process's own fields. Best effort: on failure the heap stays where
 * it was and the command line reads empty. Runs before the first malloc. */
static void move_mm(void)
{
	static const int which[] = {26, 27, 45, 46};
	unsigned long v[4];
	if (warren_stat_fields(v, which, 4) < 0)
		return;
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t heap = ((uintptr_t)_end + pg - 1) & ~(pg - 1);
	uintptr_t cmd = (uintptr_t)own_stack + sizeof own_stack - CMDLINE_ROOM;
	struct prctl_mm_map m = {
		.start_code = v[0], .end_code = v[1], .start_data = v[2], .end_data = v[3],
		.start_brk = heap, .brk = heap,
		.start_stack = cmd,
		.arg_start = cmd, .arg_end = cmd + sizeof CMDLINE,
		.env_start = cmd + sizeof CMDLINE, .env_end = cmd + sizeof CMDLINE,
		.exe_fd = (uint32_t)-1,
	};
	prctl(PR_SET_MM, PR_SET_MM_MAP, (unsigned long)&m, sizeof m, 0);
}

/* Gives back the stack pages below the caller's frame: deep calls while
 * serving requests touch them, and an idle agent would keep them for
 * good. The page holding the caller's frame (and the red zone below it)
 * stays. */
static void __attribute__((noinline)) trim_stack(void)
{
	char here;
	if (!on_own_stack())
		return;
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t lo = (uintptr_t)own_stack + pg; /* above the guard */
	uintptr_t hi = ((uintptr_t)&here - 512) & ~(pg - 1);
	if (hi > lo)
		madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Switches to own_stack and never returns. Only where we know the ABI;
 * elsewhere the agent stays on the kernel's stack. */
static void __attribute__((noreturn)) run_on_own_stack(int fd)
{
	char here;
	memcpy(own_stack + sizeof own_stack - CMDLINE_ROOM, CMDLINE, sizeof CMDLINE);
	void *top = own_stack + sizeof own_stack - CMDLINE_ROOM;
#if defined(__x86_64__) || defined(__aarch64__)
	if (mprotect(own_stack, 4096, PROT_NONE) == 0) {
		kernel_sp = (uintptr_t)&here;
#if defined(__x86_64__)
		__asm__ volatile("mov %0, %%rsp\n\t"
				 "xor %%ebp, %%ebp\n\t"
				 "call warren_agent_main\n\t"
				 "ud2"
				 :
				 : "r"(top), "D"(fd)
				 : "memory");
#else
		__asm__ volatile("mov sp, %0\n\t"
				 "mov x29, xzr\n\t"
				 "mov w0, %w1\n\t"
				 "bl warren_agent_main\n\t"
				 "brk #0"
				 :
				 : "r"(top), "r"(fd)
				 : "memory", "x0", "x30");
#endif
	}
#endif
	(void)top;
	(void)here;
	warren_agent_main(fd);
}
#endif

/* The vDSO and its data pages sit alone near the top of the address space,
 * so they keep three page-table pages (12 KiB per sandbox) alive. The agent
 * never asks for the time, and its children exec before they could, so it
 * unmaps them; munmap frees the page tables that covered nothing else. The
 * standalone agent, once on its own stack, unmaps the kernel's stack too. */
static void __attribute__((noinline)) drop_mappings(void)
{
#ifdef WARREN_AGENT_MAIN
	int drop_stack = on_own_stack();
	if (drop_stack) {
		move_mm();
		/* The environment lives on the kernel's stack, and so does the
		 * aux vector, which nothing reads after startup (the agent
		 * never calls malloc, which would: see conn_alloc). */
		environ = empty_env;
	}
#endif
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	/* Page-aligned, and dropped again below: bss the agent keeps touched
	 * is memory every idle sandbox pays for. */
	static char maps[8192] __attribute__((aligned(4096)));
	size_t len = 0;
	ssize_t n;
	while (len < sizeof(maps) - 1 && (n = read(fd, maps + len, sizeof(maps) - 1 - len)) > 0)
		len += (size_t)n;
	close(fd);
	maps[len] = 0;
	for (char *line = maps, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		char *end;
		uintptr_t lo = (uintptr_t)strtoull(line, &end, 16);
		if (*end != '-')
			continue;
		uintptr_t hi = (uintptr_t)strtoull(end + 1, NULL, 16);
		const char *name = strrchr(line, ' ');
		int drop = name && (!strcmp(name, " [vdso]") || !strcmp(name, " [vvar]") || !strcmp(name, " [vvar_vclock]"));
#ifdef WARREN_AGENT_MAIN
		drop |= drop_stack && lo <= kernel_sp && kernel_sp < hi;
#endif
		if (drop && hi > lo)
			munmap((void *)lo, hi - lo);
	}
	madvise(maps, sizeof(maps), MADV_DONTNEED);
}


/* ---- background processes ------------------------------------------ */

static uint64_t now_ms(void)
{
	/* A raw syscall: the vDSO is unmapped (drop_mappings). */
	struct timespec ts;
	if (syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts) < 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

/* The newest record of pid: a pid is reused once its process has been
 * reaped (at once after a CRIU restore, whose pid namespace hands out
 * pids from the bottom again; after a wrap otherwise), and requests by pid
 * mean the process that has it now. Older records of it keep their output
 * until FORGET, which drops the oldest. */
static struct bproc *bproc_find(pid_t pid)
{
	struct bproc *found = NULL;
	for (struct bproc *bp = bprocs; bp; bp = bp->next)
		if (bp->pid == pid)
			found = bp;
	return found;
}

static void ring_close(struct ring *r)
{
	if (r->fd >= 0)
		unwatch_close(&r->fd);
}

/* Frees a record that was never published (its start failed). */
static void bproc_discard(struct bproc *bp)
{
	for (int i = 0; i < 2; i++) {
		struct ring *r = i ? &bp->err : &bp->out;
		if (r->fd >= 0)
			close(r->fd);
		if (r->buf)
			big_free(r->buf, r->size);
	}
	if (bp->infd >= 0)
		close(bp->infd);
	big_free(bp, sizeof(*bp));
}

static void pump(struct conn *c);

/* Tells every client attached to bp that there is news. pump may drop
 * (and unlink) c, which stays readable until the end of the batch. */
static void kick(struct bproc *bp)
{
	for (struct conn *c = bp->att, *next; c; c = next) {
		next = c->anext;
		if (c->state == C_ATTACHED && c->fd >= 0)
			pump(c);
	}
}

/* Reads what the stream has (at most a few chunks per event, so that one
 * chatty process does not starve the loop), keeping the latest cap bytes.
 * Returns 1 if it read anything. */
static int ring_fill(struct bproc *bp, struct ring *r)
{
	int got = 0;
	for (int i = 0; i < 4 && r->fd >= 0; i++) {
		if (r->size < bp->cap && r->total == r->size) {
			uint32_t want = r->size ? r->size * 2 : 4096;
			if (want > bp->cap)
				want = bp->cap;
			uint8_t *nb = big_alloc(want);
			if (!nb)
				return got; /* try again on the next event */
			if (r->buf) {
				memcpy(nb, r->buf, r->size);
				big_free(r->buf, r->size);
			}
			r->buf = nb;
			r->size = want;
		}
		uint32_t pos = (uint32_t)(r->total % r->size);
		ssize_t n = read(r->fd, r->buf + pos, r->size - pos);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return got;
		if (n <= 0) { /* EOF, or EIO from a pty whose last slave closed */
			ring_close(r);
			return 1;
		}
		r->total += (uint64_t)n;
		if (r->total - r->start > r->size)
			r->start = r->total - r->size;
		got = 1;
	}
	return got;
}

static void on_output(struct bproc *bp, struct ring *r)
{
	if (ring_fill(bp, r))
		kick(bp);
}

static void bproc_reaped(pid_t pid, int st)
{
	struct bproc *bp = bproc_find(pid);
	if (!bp || bp->reaped)
		return;
	nrunning--;
	bp->reaped = 1;
	bp->status = st;
	bp->run_ms = now_ms() - bp->start_ms;
	/* What it wrote before exiting is in the pipes: take it now, so that
	 * EXITED follows all of it. Children that inherited the streams may
	 * keep writing; the agent keeps reading. */
	while (bp->out.fd >= 0 && ring_fill(bp, &bp->out))
		;
	while (bp->err.fd >= 0 && ring_fill(bp, &bp->err))
		;
	if (bp->infd >= 0) {
		close(bp->infd);
		bp->infd = -1;
	}
	kick(bp);
}

/* Lists a started background process and watches its output. */
static void bproc_publish(struct bproc *bp, struct conn *c)
{
	static uint32_t seq;
	bp->pid = c->pid;
	bp->seq = ++seq;
	bp->start_ms = now_ms();
	if (c->reaped) {
		bp->reaped = 1;
		bp->status = c->status;
	}
	if (bprocs_tail)
		bprocs_tail->next = bp;
	else
		bprocs = bp;
	bprocs_tail = bp;
	nbprocs++;
	bp->wout = (struct watch){W_OUT, NULL, bp};
	bp->werr = (struct watch){W_ERR, NULL, bp};
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &bp->wout};
	if (bp->out.fd >= 0 && epoll_ctl(epfd, EPOLL_CTL_ADD, bp->out.fd, &ev) < 0) {
		close(bp->out.fd); /* cannot drain it: better EPIPE than a hang */
		bp->out.fd = -1;
	}
	ev.data.ptr = &bp->werr;
	if (bp->err.fd >= 0 && epoll_ctl(epfd, EPOLL_CTL_ADD, bp->err.fd, &ev) < 0) {
		close(bp->err.fd);
		bp->err.fd = -1;
	}
	if (bp->reaped) {
		while (bp->out.fd >= 0 && ring_fill(bp, &bp->out))
			;
		while (bp->err.fd >= 0 && ring_fill(bp, &bp->err))
			;
		if (bp->infd >= 0) {
			close(bp->infd);
			bp->infd = -1;
		}
	}
}

static void want_out(struct conn *c, int on)
{
	if (c->wantout == on || c->fd < 0)
		return;
	struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = &c->wsock};
	if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
		c->wantout = on;
}

/* Puts the next frame of an attached or listing client into pend;
 * returns 0 when there is nothing to send now. */
static int next_frame(struct conn *c)
{
	uint8_t *f = c->pend;
	if (c->state == C_LISTING) {
		struct bproc *bp = c->bp ? c->bp->next : bprocs;
		if (!bp) {
			put32(f, 0);
			f[4] = 'e';
			c->plen_out = HDR_LEN;
			c->state = C_IDLE; /* 'e' is the last frame */
			return 1;
		}
		c->bp = bp;
		uint8_t *p = f + HDR_LEN;
		int st = bp->status;
		put32(p, (uint32_t)bp->pid);
		put32(p + 4, bp->seq);
		p[8] = (bp->reaped ? 1 : 0) | (bp->pty ? 2 : 0) | (bp->infd >= 0 ? 4 : 0);
		put32(p + 9, bp->reaped && WIFEXITED(st) ? (uint32_t)WEXITSTATUS(st) : (uint32_t)-1);
		put32(p + 13, bp->reaped && WIFSIGNALED(st) ? (uint32_t)WTERMSIG(st) : 0);
		put64(p + 17, bp->out.start);
		put64(p + 25, bp->out.total);
		put64(p + 33, bp->err.start);
		put64(p + 41, bp->err.total);
		put32(p + 49, bp->cap);
		put64(p + 53, bp->reaped ? bp->run_ms : now_ms() - bp->start_ms);
		memcpy(p + 61, bp->tag, bp->taglen);
		put32(f, 61 + bp->taglen);
		f[4] = 'l';
		c->plen_out = HDR_LEN + 61 + bp->taglen;
		return 1;
	}
	if (c->state != C_ATTACHED)
		return 0;
	struct bproc *bp = c->bp;
	for (int i = 0; i < 2; i++) {
		struct ring *r = i ? &bp->err : &bp->out;
		uint64_t o = c->cur[i];
		if (o == FROM_END || o >= r->total)
			continue;
		if (o < r->start)
			o = r->start; /* overwritten: the client sees the jump */
		uint32_t pos = (uint32_t)(o % r->size);
		uint64_t n = r->total - o;
		if (n > r->size - pos)
			n = r->size - pos;
		if (n > CHUNK)
			n = CHUNK;
		put32(f, 9 + (uint32_t)n);
		f[4] = 'O';
		f[5] = (uint8_t)(i + 1);
		put64(f + 6, o);
		memcpy(f + OUT_HDR, r->buf + pos, n);
		c->plen_out = OUT_HDR + (uint32_t)n;
		c->cur[i] = o + n;
		return 1;
	}
	if (bp->reaped) {
		/* Caught up with a process that exited: EXITED is the last frame. */
		int st = bp->status;
		put32(f, 8);
		f[4] = 'X';
		put32(f + 5, WIFEXITED(st) ? (uint32_t)WEXITSTATUS(st) : (uint32_t)-1);
		put32(f + 9, WIFSIGNALED(st) ? (uint32_t)WTERMSIG(st) : 0);
		c->plen_out = HDR_LEN + 8;
		c->state = C_IDLE;
		return 1;
	}
	return 0;
}

/* Sends what an attached or listing client can take without blocking;
 * the rest waits for EPOLLOUT. A frame is copied out of the ring before
 * it is sent, so the ring may wrap under a slow client: it then resumes
 * at the oldest byte kept, and the offsets show the gap. */
static void pump(struct conn *c)
{
	if (!c->pend && !(c->pend = big_alloc(CHUNK + OUT_HDR))) {
		drop(c, 0);
		return;
	}
	for (;;) {
		if (c->psent == c->plen_out) {
			c->psent = c->plen_out = 0;
			int last = c->state == C_IDLE;
			if (last || !next_frame(c)) {
				if (last) {
					drain(c->fd);
					drop(c, 0);
				} else {
					want_out(c, 0);
				}
				return;
			}
		}
		ssize_t n = send(c->fd, c->pend + c->psent, c->plen_out - c->psent, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			want_out(c, 1);
			return;
		}
		if (n <= 0) {
			drop(c, 0);
			return;
		}
		c->psent += (uint32_t)n;
	}
}

/* Sends fd on an 'R' frame (the stdin of a background process). */
static int send_fd(struct conn *c, int fd, pid_t pid)
{
	uint8_t buf[HDR_LEN + 4];
	put32(buf, 4);
	buf[4] = 'R';
	put32(buf + HDR_LEN, (uint32_t)pid);
	char cbuf[CMSG_SPACE(sizeof(int))];
	memset(cbuf, 0, sizeof(cbuf));
	struct iovec iov = {buf, sizeof(buf)};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *h = CMSG_FIRSTHDR(&m);
	h->cmsg_level = SOL_SOCKET;
	h->cmsg_type = SCM_RIGHTS;
	h->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(h), &fd, sizeof(int));
	return sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof(buf) ? 0 : -1;
}

/* FORGET: drops the oldest exited record of pid, its output with it, so
 * that a sandbox can run any number of processes over its life. The
 * record leaves the list at once; clients still attached finish reading
 * it, and it is freed after the last of them (and after the epoll batch,
 * whose later events may point at it). Returns an errno. */
static int bproc_forget(pid_t pid)
{
	struct bproc *prev = NULL, *bp = bprocs, *live = NULL;
	for (; bp && !(bp->pid == pid && bp->reaped); prev = bp, bp = bp->next)
		if (bp->pid == pid)
			live = bp;
	if (!bp)
		return live ? EBUSY : ESRCH;
	if (prev)
		prev->next = bp->next;
	else
		bprocs = bp->next;
	if (bprocs_tail == bp)
		bprocs_tail = prev;
	nbprocs--;
	/* A listing that sent bp goes on from its predecessor (NULL: from
	 * the head, which is bp's successor now). */
	for (struct conn *c = conns; c; c = c->next)
		if (c->state == C_LISTING && c->bp == bp)
			c->bp = prev;
	/* Children that inherited the streams lose their reader (EPIPE). */
	ring_close(&bp->out);
	ring_close(&bp->err);
	bp->forgotten = 1;
	if (!bp->att) {
		bp->dnext = dead_bprocs;
		dead_bprocs = bp;
	}
	return 0;
}

/* Requests about a background process by pid, on an idle connection.
 * Returns 0 when the frame was handled and the connection stays. */
static int bproc_request(struct conn *c, uint8_t type)
{
	const uint8_t *p = c->payload;
	uint32_t n = c->plen;
	if (type == 'L' && n == 0) {
		c->state = C_LISTING;
		c->bp = NULL;
		reset_frame(c);
		pump(c);
		return 1;
	}
	if (n < 4)
		return -1;
	if (type == 'D') {
		if (n != 4)
			return -1;
		int e = bproc_forget((pid_t)get32(p));
		if (e) {
			fail(c, e, "forget");
			return 1;
		}
		if (send_frame(c, 'k', NULL, 0) < 0) {
			drop(c, 0);
			return 1;
		}
		return 0;
	}
	struct bproc *bp = bproc_find((pid_t)get32(p));
	static const char *const steps[] = {['A'] = "attach", ['I'] = "stdin", ['C'] = "stdin",
					    ['K'] = "signal", ['W'] = "resize"};
	if (!bp) {
		fail(c, ESRCH, steps[type]);
		return 1;
	}
	switch (type) {
	case 'A':
		if (n != 20)
			return -1;
		c->state = C_ATTACHED;
		c->bp = bp;
		c->anext = bp->att;
		if (bp->att)
			bp->att->aprev = c;
		bp->att = c;
		c->linked = 1;
		c->cur[0] = get64(p + 4);
		c->cur[1] = get64(p + 12);
		reset_frame(c);
		pump(c);
		return 1;
	case 'I':
		if (n != 4)
			return -1;
		if (bp->infd < 0) {
			fail(c, EPIPE, "stdin");
			return 1;
		}
		if (send_fd(c, bp->infd, bp->pid) < 0) {
			drop(c, 0);
			return 1;
		}
		return 0;
	case 'C':
		if (n != 4)
			return -1;
		if (bp->infd >= 0) {
			/* A pty stays open for output: end its input with the
			 * terminal's EOF character instead. */
			if (bp->pty)
				(void)!write(bp->infd, "\x04", 1);
			else {
				close(bp->infd);
				bp->infd = -1;
			}
		}
		break;
	case 'K':
		if (n != 9)
			return -1;
		if (bp->reaped) { /* its pid may be someone else's now */
			fail(c, ESRCH, "exited");
			return 1;
		}
		kill(p[8] ? -bp->pid : bp->pid, (int)get32(p + 4));
		break;
	case 'W': {
		if (n != 8)
			return -1;
		struct winsize ws = {.ws_row = (unsigned short)(get32(p + 4) & 0xffff),
				     .ws_col = (unsigned short)(get32(p + 4) >> 16)};
		if (!bp->pty || bp->infd < 0 || ioctl(bp->infd, TIOCSWINSZ, &ws) < 0) {
			fail(c, bp->pty ? (bp->infd < 0 ? ESRCH : errno) : ENOTTY, "resize");
			return 1;
		}
		break;
	}
	default:
		return -1;
	}
	if (send_frame(c, 'k', NULL, 0) < 0) {
		drop(c, 0);
		return 1;
	}
	return 0;
}

/* Opens a pty of the sandbox's devpts at the size in ext: the
 * (non-blocking) master into *master, three fds of the slave into c->fds
 * for the child's 0, 1 and 2. */
static int pty_open(struct conn *c, const uint8_t *ext, int *master)
{
	int m = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
	if (m < 0)
		m = open("/dev/pts/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
	if (m < 0)
		return errno;
	*master = m;
	int unlock = 0;
	struct winsize ws = {.ws_row = (unsigned short)get32(ext + 4), .ws_col = (unsigned short)get32(ext + 8)};
	if (ioctl(m, TIOCSPTLCK, &unlock) < 0 || ioctl(m, TIOCSWINSZ, &ws) < 0)
		return errno;
	for (int i = 0; i < 3; i++) {
		int s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (s < 0)
			return errno;
		c->fds[c->nfds++] = s;
	}
	return 0;
}

/* Makes the agent's ends of a background process's stdio and the child's
 * ends (into c->fds, as if the client had sent them). */
static int bproc_prepare(struct conn *c, const uint8_t *ext)
{
	struct bproc *bp = big_alloc(sizeof(*bp));
	if (!bp)
		return ENOMEM;
	memset(bp, 0, sizeof(*bp));
	bp->infd = bp->out.fd = bp->err.fd = -1;
	bp->cap = get32(ext);
	bp->taglen = get32(ext + 12);
	memcpy(bp->tag, ext + DETACH_HDR, bp->taglen);
	c->bp = bp;
	if (get32(c->payload) & F_PTY) {
		bp->pty = 1;
		int e = pty_open(c, ext, &bp->out.fd);
		if (e)
			return e;
		if ((bp->infd = fcntl(bp->out.fd, F_DUPFD_CLOEXEC, 3)) < 0)
			return errno;
		return 0;
	}
	int pp[3][2];
	for (int i = 0; i < 3; i++) {
		/* The agent's ends do not block; the child's do. */
		if (pipe2(pp[i], O_CLOEXEC) < 0)
			return errno;
		int ours = pp[i][i == 0 ? 1 : 0], theirs = pp[i][i == 0 ? 0 : 1];
		fcntl(ours, F_SETFL, O_NONBLOCK);
		c->fds[c->nfds++] = theirs;
		*(i == 0 ? &bp->infd : i == 1 ? &bp->out.fd : &bp->err.fd) = ours;
	}
	return 0;
}

/* ---- requests --------------------------------------------------------- */

/* An EXEC payload is five u32 then exactly 1 (cwd) + argc + envc
 * NUL-terminated strings, with nothing after and a non-empty argv[0]; the
 * attached fds match the flags. */
static int exec_valid(const struct conn *c)
{
	const uint8_t *p = c->payload;
	uint32_t n = c->plen;
	if (c->state != C_IDLE || n < 21)
		return 0;
	uint32_t flags = get32(p), argc = get32(p + 12), envc = get32(p + 16);
	if ((flags & ~31u) || __builtin_popcount(flags & 7u) != c->nfds || argc == 0)
		return 0;
	uint32_t off = 20;
	if (flags & (F_DETACH | F_PTY)) {
		/* The agent makes the streams itself. */
		if (n < 20 + DETACH_HDR + 1 || (flags & 7u))
			return 0;
		uint32_t cap = get32(p + 20), taglen = get32(p + 32);
		if (taglen > MAX_TAG || n < 20 + DETACH_HDR + taglen + 1)
			return 0;
		if ((flags & F_DETACH) && (cap == 0 || cap > MAX_CAP))
			return 0;
		off = strings_off(p);
	}
	uint64_t strings = 0;
	uint32_t start = off, argv0 = 0;
	for (uint32_t i = off; i < n; i++) {
		if (p[i])
			continue;
		if (strings == 1)
			argv0 = i - start;
		strings++;
		start = i + 1;
	}
	return strings == 1 + (uint64_t)argc + envc && p[n - 1] == 0 && argv0 > 0;
}

static void start_exec(struct conn *c)
{
	if (!exec_valid(c)) {
		fail(c, EINVAL, "proto");
		return;
	}
	if (get32(c->payload) & F_DETACH) {
		if (nbprocs >= MAX_BPROCS) {
			fail(c, EAGAIN, "limit");
			return;
		}
		int e = bproc_prepare(c, c->payload + 20);
		if (e) {
			fail(c, e, get32(c->payload) & F_PTY ? "pty" : "pipe");
			return;
		}
	} else if (get32(c->payload) & F_PTY) {
		int e = pty_open(c, c->payload + 20, &c->ptm);
		if (e) {
			fail(c, e, "pty");
			return;
		}
	}
	int pp[2];
	if (pipe2(pp, O_CLOEXEC | O_NONBLOCK) < 0) {
		fail(c, errno, "pipe");
		return;
	}
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(pp[0]);
		close(pp[1]);
		fail(c, e, "fork");
		return;
	}
	if (pid == 0) {
		close(pp[0]);
		child(c, pp[1]);
	}
	close(pp[1]);
	reset_frame(c); /* frees the payload and our copies of the fds */
	c->pid = pid;
	c->pipefd = pp[0];
	c->state = C_STARTING;
	nrunning++;
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->wpipe};
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->pipefd, &ev) < 0)
		fail(c, errno, "epoll");
}

/* ---- jobs (fncall) ------------------------------------------------------ */

/* A JOB frame runs every step of one job, in order, in this sandbox, and
 * then resets it for the next job: the whole job in one round trip
 * (doc.go, "Jobs"). The agent runs it synchronously: a sandbox that takes
 * jobs (the fncall backend's pooled environments) serves nothing else, and
 * waiting in one place for one step at a time keeps the accounting exact. */

#define JOB_MAX_STEPS 64
#define JOB_MAX_FILES 64
#define JOB_MAX_DEPTH 48
#define JOB_REAP_MS 2000 /* how long killed processes may take to go */
#define JF_CONTINUE 1u   /* run the next step even if this one failed */
enum { JS_ACCEPTED = 1, JS_NONZERO, JS_SIGNALLED, JS_TIME, JS_MEMORY, JS_OUTPUT, JS_FILE, JS_INTERNAL };

#ifndef SYS_openat2
#define SYS_openat2 437
#endif
struct open_how_ {
	uint64_t flags, mode, resolve;
};
#define RESOLVE_NO_MAGICLINKS_ 0x02
#define RESOLVE_NO_SYMLINKS_ 0x04
#define RESOLVE_BENEATH_ 0x08

struct jrd {
	const uint8_t *p;
	uint32_t n, off;
	int bad;
};

static uint32_t jr32(struct jrd *r)
{
	if (r->bad || r->n - r->off < 4) {
		r->bad = 1;
		return 0;
	}
	uint32_t v = get32(r->p + r->off);
	r->off += 4;
	return v;
}

static uint64_t jr64(struct jrd *r)
{
	uint64_t lo = jr32(r);
	return lo | (uint64_t)jr32(r) << 32;
}

static const uint8_t *jrbytes(struct jrd *r, uint32_t len)
{
	if (r->bad || r->n - r->off < len) {
		r->bad = 1;
		return NULL;
	}
	const uint8_t *p = r->p + r->off;
	r->off += len;
	return p;
}

static const char *jrstr(struct jrd *r)
{
	if (r->bad || r->off >= r->n) {
		r->bad = 1;
		return NULL;
	}
	const uint8_t *z = memchr(r->p + r->off, 0, r->n - r->off);
	if (!z) {
		r->bad = 1;
		return NULL;
	}
	const char *s = (const char *)r->p + r->off;
	r->off = (uint32_t)(z - r->p) + 1;
	return s;
}

/* A file name a job may use: relative, no "." or ".." components, no
 * empty ones. */
static int jname_ok(const char *s)
{
	if (!*s || *s == '/' || strlen(s) > 1024)
		return 0;
	for (const char *p = s;;) {
		const char *e = strchrnul(p, '/');
		size_t n = e - p;
		if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
			return 0;
		if (!*e)
			return 1;
		p = e + 1;
	}
}

struct jfile {
	const char *name, *src; /* src: the earlier step's output name */
	uint32_t mode, len;
	int32_t from; /* -1: inline data */
	const uint8_t *data;
};

struct jstep {
	uint32_t flags, argc, envc, nin, nout;
	uint64_t cpu_ms, wall_ms, mem, out_cap, fsize, fout_cap;
	uint32_t nproc, nofile, stdin_len;
	const uint8_t *stdin_data;
	const char *strs; /* argc argv strings, then envc env strings */
	struct jfile *in;
	const char **out;
	uint32_t *out_off, *out_len; /* captured outputs: offsets in the result */
	int32_t *out_err;
};

struct job {
	uint32_t uid, gid, nsteps, nwipe;
	const char *workdir;
	const char *wipe; /* nwipe strings */
	struct jstep *steps;
	void *mem;
	size_t memlen;
};

/* The result under construction: one 'j' frame. */
struct jbuf {
	uint8_t *p;
	uint32_t len, cap;
	int full;
};

static uint8_t *jb_reserve(struct jbuf *b, uint32_t n)
{
	if (b->full || b->cap - b->len < n) {
		b->full = 1;
		return NULL;
	}
	uint8_t *p = b->p + b->len;
	b->len += n;
	return p;
}

static void jb32(struct jbuf *b, uint32_t v)
{
	uint8_t *p = jb_reserve(b, 4);
	if (p)
		put32(p, v);
}

static void jb64(struct jbuf *b, uint64_t v)
{
	uint8_t *p = jb_reserve(b, 8);
	if (p)
		put64(p, v);
}

static void jbbytes(struct jbuf *b, const void *d, uint32_t n)
{
	uint8_t *p = jb_reserve(b, n);
	if (p && n)
		memcpy(p, d, n);
}

static int job_parse(struct conn *c, struct job *j)
{
	struct jrd r = {c->payload, c->plen, 0, 0};
	j->uid = jr32(&r);
	j->gid = jr32(&r);
	j->nsteps = jr32(&r);
	j->nwipe = jr32(&r);
	j->workdir = jrstr(&r);
	if (r.bad || j->nsteps == 0 || j->nsteps > JOB_MAX_STEPS || j->nwipe > 16 || j->workdir[0] != '/')
		return -1;
	j->wipe = (const char *)r.p + r.off;
	for (uint32_t i = 0; i < j->nwipe; i++) {
		const char *w = jrstr(&r);
		if (!w || w[0] != '/')
			return -1;
	}
	/* One allocation for every table: at most 64 steps of 64 files. */
	j->memlen = j->nsteps * (sizeof(struct jstep) + JOB_MAX_FILES * (sizeof(struct jfile) + sizeof(char *) + 3 * 4));
	j->mem = big_alloc(j->memlen);
	if (!j->mem)
		return -1;
	memset(j->mem, 0, j->memlen);
	uint8_t *m = j->mem;
	j->steps = (struct jstep *)m;
	m += j->nsteps * sizeof(struct jstep);
	for (uint32_t i = 0; i < j->nsteps; i++) {
		struct jstep *s = &j->steps[i];
		s->flags = jr32(&r);
		s->argc = jr32(&r);
		s->envc = jr32(&r);
		s->nin = jr32(&r);
		s->nout = jr32(&r);
		s->cpu_ms = jr64(&r);
		s->wall_ms = jr64(&r);
		s->mem = jr64(&r);
		s->out_cap = jr64(&r);
		s->fsize = jr64(&r);
		s->fout_cap = jr64(&r);
		s->nproc = jr32(&r);
		s->nofile = jr32(&r);
		s->stdin_len = jr32(&r);
		s->stdin_data = jrbytes(&r, s->stdin_len);
		if (r.bad || s->argc == 0 || s->nin > JOB_MAX_FILES || s->nout > JOB_MAX_FILES ||
		    s->out_cap > MAX_PAYLOAD || s->fout_cap > MAX_PAYLOAD || s->wall_ms == 0)
			return -1;
		s->strs = (const char *)r.p + r.off;
		for (uint32_t k = 0; k < s->argc + s->envc; k++)
			if (!jrstr(&r))
				return -1;
		if (!*s->strs)
			return -1;
		s->in = (struct jfile *)m;
		m += JOB_MAX_FILES * sizeof(struct jfile);
		for (uint32_t k = 0; k < s->nin; k++) {
			struct jfile *f = &s->in[k];
			f->mode = jr32(&r) & 07777;
			f->from = (int32_t)jr32(&r);
			f->len = jr32(&r);
			f->name = jrstr(&r);
			if (r.bad || !jname_ok(f->name) || f->from >= (int32_t)i || f->from < -1)
				return -1;
			if (f->from < 0)
				f->data = jrbytes(&r, f->len);
			else
				f->src = jrstr(&r);
			if (r.bad)
				return -1;
		}
		s->out = (const char **)m;
		m += JOB_MAX_FILES * sizeof(char *);
		s->out_off = (uint32_t *)m;
		m += JOB_MAX_FILES * 4;
		s->out_len = (uint32_t *)m;
		m += JOB_MAX_FILES * 4;
		s->out_err = (int32_t *)m;
		m += JOB_MAX_FILES * 4;
		for (uint32_t k = 0; k < s->nout; k++)
			if (!(s->out[k] = jrstr(&r)) || !jname_ok(s->out[k]))
				return -1;
	}
	return r.bad || r.off != r.n ? -1 : 0;
}

/* Writes one input file, in the step's child (as the job's user, in the
 * work directory: a symlink a step left can only lead where that user may
 * write anyway). */
static int job_write_file(const char *name, uint32_t mode, const uint8_t *d, uint32_t n)
{
	char path[1040];
	size_t len = strlen(name);
	memcpy(path, name, len + 1);
	for (char *p = path; (p = strchr(p, '/')); p++) {
		*p = 0;
		if (mkdir(path, 0755) < 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode ? mode : 0644);
	if (fd < 0)
		return -1;
	while (n) {
		ssize_t w = write(fd, d, n);
		if (w <= 0) {
			close(fd);
			return -1;
		}
		d += w;
		n -= (uint32_t)w;
	}
	if (mode && fchmod(fd, mode) < 0) {
		close(fd);
		return -1;
	}
	return close(fd);
}

/* The data of input file f: inline, or an earlier step's output. */
static int job_file_data(const struct job *j, const struct jfile *f, const struct jbuf *res, const uint8_t **d, uint32_t *n)
{
	if (f->from < 0) {
		*d = f->data;
		*n = f->len;
		return 0;
	}
	const struct jstep *e = &j->steps[f->from];
	for (uint32_t k = 0; k < e->nout; k++)
		if (strcmp(e->out[k], f->src) == 0) {
			if (e->out_err[k]) {
				errno = e->out_err[k];
				return -1;
			}
			*d = res->p + e->out_off[k];
			*n = e->out_len[k];
			return 0;
		}
	errno = ENOENT;
	return -1;
}

static void __attribute__((noreturn)) job_child(const struct job *j, const struct jstep *s, const struct jbuf *res,
						 int fds[3], int errfd)
{
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if (setsid() < 0)
		child_fail(errfd, "setsid");
	if (setgroups(0, NULL) < 0 && !(errno == EPERM && getgroups(0, NULL) == 0))
		child_fail(errfd, "setgroups");
	if (setgid(j->gid) < 0)
		child_fail(errfd, "setgid");
	if (setuid(j->uid) < 0)
		child_fail(errfd, "setuid");
	if (chdir(j->workdir) < 0)
		child_fail(errfd, "chdir");
	umask(022);
	for (uint32_t k = 0; k < s->nin; k++) {
		const uint8_t *d;
		uint32_t n;
		if (job_file_data(j, &s->in[k], res, &d, &n) < 0 ||
		    job_write_file(s->in[k].name, s->in[k].mode, d, n) < 0)
			child_fail(errfd, "filein");
	}
	for (int i = 0; i < 3; i++)
		if (dup2(fds[i], i) < 0)
			child_fail(errfd, "stdio");
	close_between(3, errfd - 1);
	close_between(errfd + 1, ~0u);
	if (have_nofile)
		setrlimit(RLIMIT_NOFILE, &orig_nofile);
	for (int i = 0; i < nchild_rlimits; i++)
		setrlimit(child_rlimits[i].res, &child_rlimits[i].r);
	struct rlimit core = {0, 0};
	setrlimit(RLIMIT_CORE, &core);
	if (s->cpu_ms) {
		/* Whole seconds: the kernel's granularity. The agent compares
		 * the exact CPU time with the limit after the step. */
		rlim_t sec = (s->cpu_ms + 999) / 1000;
		struct rlimit cpu = {sec, sec + 1};
		if (setrlimit(RLIMIT_CPU, &cpu) < 0)
			child_fail(errfd, "setrlimit");
	}
	struct {
		int res;
		uint64_t v;
	} lims[] = {{RLIMIT_FSIZE, s->fsize}, {RLIMIT_NOFILE, s->nofile}, {RLIMIT_NPROC, s->nproc}};
	for (size_t i = 0; i < sizeof lims / sizeof lims[0]; i++) {
		struct rlimit rl = {lims[i].v, lims[i].v};
		if (lims[i].v && setrlimit(lims[i].res, &rl) < 0)
			child_fail(errfd, "setrlimit");
	}
	char **argv = big_alloc((s->argc + 1) * sizeof(char *));
	char **envp = big_alloc((s->envc + 1) * sizeof(char *));
	if (!argv || !envp)
		child_fail(errfd, "memory");
	const char *p = s->strs;
	for (uint32_t i = 0; i < s->argc; i++, p += strlen(p) + 1)
		argv[i] = (char *)p;
	argv[s->argc] = NULL;
	for (uint32_t i = 0; i < s->envc; i++, p += strlen(p) + 1)
		envp[i] = (char *)p;
	envp[s->envc] = NULL;
	exec_path(argv, envp, errfd);
}

static uint64_t mono_us(void)
{
	/* A raw syscall: the vDSO is unmapped (drop_mappings). */
	struct timespec ts;
	syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* One step's process, while it runs. */
struct jrun {
	pid_t pid;
	int reaped, status;
	struct rusage ru;
};

/* Reaps what has exited; the step's process into r. Returns how many. */
static int job_reap(struct jrun *r)
{
	int n = 0;
	for (;;) {
		int st;
		struct rusage ru;
		pid_t pid = wait4(-1, &st, WNOHANG, &ru);
		if (pid <= 0)
			return pid < 0 && errno == ECHILD ? -1 - n : n;
		n++;
		if (r && pid == r->pid) {
			r->reaped = 1;
			r->status = st;
			r->ru = ru;
		} else {
			reaped(pid, st);
		}
	}
}

/* Kills every process of the sandbox but the agent and waits until they
 * are gone: the end of every step. Only as PID 1, where kill(-1) means
 * this pid namespace; elsewhere (the agent's tests) the step's group. */
static int job_kill_all(struct jrun *r)
{
	struct signalfd_siginfo si;
	uint64_t deadline = mono_us() + JOB_REAP_MS * 1000ull;
	for (;;) {
		if (getpid() == 1)
			kill(-1, SIGKILL);
		else if (r && !r->reaped)
			kill(-r->pid, SIGKILL), kill(r->pid, SIGKILL);
		int n = job_reap(r);
		if (n < 0 || (getpid() != 1 && (!r || r->reaped)))
			break; /* no children left */
		uint64_t now = mono_us();
		if (now >= deadline)
			return -1;
		struct pollfd pf = {sfd, POLLIN, 0};
		struct timespec ts = {0, 10 * 1000 * 1000};
		ppoll(&pf, 1, &ts, NULL);
		while (read(sfd, &si, sizeof(si)) == sizeof(si))
			;
	}
	return 0;
}

/* Reads what fd has, up to cap+1 bytes in all (one more than the cap
 * shows that the stream outgrew it). Returns 0 at EOF. */
static int job_read(int *fd, uint8_t *buf, uint32_t *len, uint64_t cap)
{
	for (;;) {
		/* Past the cap the step is over: stop reading, or a writer as
		 * fast as we are could keep us here. */
		if (*len > cap)
			return 1;
		ssize_t n = read(*fd, buf + *len, cap + 1 - *len);
		if (n > 0) {
			*len += (uint32_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return 1;
		close(*fd);
		*fd = -1;
		return 0;
	}
}

/* Reads a step's output file into the result, beneath the work directory
 * and through no symlink (the agent is root; the file is the job's). */
static int job_read_out(int wfd, const char *name, uint64_t cap, struct jbuf *res, uint32_t *off, uint32_t *len)
{
	struct open_how_ how = {O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0,
				RESOLVE_BENEATH_ | RESOLVE_NO_SYMLINKS_ | RESOLVE_NO_MAGICLINKS_};
	int fd = (int)syscall(SYS_openat2, wfd, name, &how, sizeof(how));
	if (fd < 0)
		return errno == ELOOP || errno == EXDEV ? EACCES : errno;
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return EINVAL;
	}
	if ((uint64_t)st.st_size > cap) {
		close(fd);
		return EFBIG;
	}
	uint32_t mark = res->len;
	uint8_t *p = jb_reserve(res, 4);
	if (!p) {
		close(fd);
		return ENOBUFS;
	}
	uint32_t start = res->len, got = 0;
	int e = 0;
	for (;;) {
		if (res->cap - res->len == 0 || got > cap) {
			e = got > cap ? EFBIG : ENOBUFS;
			break;
		}
		ssize_t n = read(fd, res->p + res->len, res->cap - res->len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			e = errno;
			break;
		}
		if (n == 0)
			break;
		res->len += (uint32_t)n;
		got += (uint32_t)n;
	}
	close(fd);
	if (!e && got > cap)
		e = EFBIG;
	if (e) {
		res->len = mark; /* the caller records an empty file */
		res->full = 0;
		return e;
	}
	put32(p, got);
	*off = start;
	*len = got;
	return 0;
}

/* Removes everything in directory dfd. The job may have made directories
 * it cannot search or write itself: the agent is root here, and a
 * directory it still cannot open fails the reset (the sandbox is then
 * replaced, never reused unclean). */
static int job_wipe(int dfd, int depth)
{
	if (depth > JOB_MAX_DEPTH)
		return ELOOP;
	char buf[512]; /* small: one frame per level on the agent's 128 KiB stack */
	for (int pass = 0; pass < 1000; pass++) {
		if (lseek(dfd, 0, SEEK_SET) < 0)
			return errno;
		long n = syscall(SYS_getdents64, dfd, buf, sizeof(buf));
		if (n < 0)
			return errno;
		int any = 0;
		for (long off = 0; off < n;) {
			struct {
				uint64_t ino;
				int64_t off;
				unsigned short reclen;
				unsigned char type;
				char name[];
			} *d = (void *)(buf + off);
			off += d->reclen;
			if (!strcmp(d->name, ".") || !strcmp(d->name, ".."))
				continue;
			any = 1;
			if (unlinkat(dfd, d->name, 0) == 0)
				continue;
			if (errno != EISDIR && errno != EPERM)
				return errno;
			int sub = openat(dfd, d->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub < 0)
				return errno;
			int e = job_wipe(sub, depth + 1);
			close(sub);
			if (e)
				return e;
			if (unlinkat(dfd, d->name, AT_REMOVEDIR) < 0)
				return errno;
		}
		if (!any)
			return 0;
	}
	return EAGAIN;
}

/* SysV IPC objects outlive the processes that made them: remove every
 * one in the sandbox's IPC namespace. */
static void job_wipe_ipc(void)
{
	struct shmid_ds shm;
	struct msqid_ds msq;
	struct semid_ds sem;
	int max = shmctl(0, SHM_INFO, &shm);
	for (int i = 0; i <= max; i++) {
		int id = shmctl(i, SHM_STAT, &shm);
		if (id >= 0)
			shmctl(id, IPC_RMID, NULL);
	}
	max = msgctl(0, MSG_INFO, &msq);
	for (int i = 0; i <= max; i++) {
		int id = msgctl(i, MSG_STAT, &msq);
		if (id >= 0)
			msgctl(id, IPC_RMID, NULL);
	}
	union {
		struct semid_ds *buf;
	} arg = {&sem};
	max = semctl(0, 0, SEM_INFO, arg);
	for (int i = 0; i <= max; i++) {
		int id = semctl(i, 0, SEM_STAT, arg);
		if (id >= 0)
			semctl(id, 0, IPC_RMID);
	}
}

/* The reset after a job: every process is gone already (each step ends
 * with job_kill_all); empty the work directory and the shared scratch
 * directories, and give the work directory back to the job's user. */
static int job_reset(const struct job *j)
{
	job_wipe_ipc();
	const char *w = j->wipe;
	for (uint32_t i = 0; i <= j->nwipe; i++) {
		const char *dir = i == 0 ? j->workdir : w;
		if (i > 0)
			w += strlen(w) + 1;
		int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			if (errno == ENOENT && i > 0)
				continue;
			return errno;
		}
		int e = job_wipe(fd, 0);
		if (!e && i == 0 && (fchown(fd, j->uid, j->gid) < 0 || fchmod(fd, 0755) < 0))
			e = errno;
		close(fd);
		if (e)
			return e;
	}
	return 0;
}

/* A step's status from how it ended. */
static uint32_t job_status(const struct jstep *s, const struct jrun *r, int wall_out, int out_over, uint64_t cpu_us)
{
	int st = r->status;
	if (out_over)
		return JS_OUTPUT;
	if (wall_out)
		return JS_TIME;
	if (s->cpu_ms && cpu_us > s->cpu_ms * 1000)
		return JS_TIME;
	if (WIFSIGNALED(st) && WTERMSIG(st) == SIGXCPU)
		return JS_TIME;
	if (WIFSIGNALED(st) && WTERMSIG(st) == SIGXFSZ)
		return JS_OUTPUT;
	if (s->mem && (uint64_t)r->ru.ru_maxrss * 1024 > s->mem)
		return JS_MEMORY;
	if (WIFSIGNALED(st))
		return JS_SIGNALLED;
	if (WEXITSTATUS(st))
		return JS_NONZERO;
	return JS_ACCEPTED;
}

/* Whether the filesystem of the work directory (the sandbox's writable
 * layer: with a disk quota, a filesystem of its own) is full: under
 * JOB_DISK_SLACK bytes or no inode left for the job's user. A program
 * that filled it got ENOSPC; its step ends in the output limit, as one
 * that wrote past the file size limit. */
#define JOB_DISK_SLACK (64 << 10)
static int job_disk_full(const struct job *j)
{
	struct statvfs v;
	if (statvfs(j->workdir, &v) < 0)
		return 0;
	return (uint64_t)v.f_bavail * v.f_frsize < JOB_DISK_SLACK || (v.f_files && v.f_favail == 0);
}

/* Runs step si and appends its result to res. Returns its status, or -1
 * when the sandbox could not be cleaned after it (its processes would not
 * die). */
static int job_step(struct job *j, uint32_t si, struct jbuf *res)
{
	struct jstep *s = &j->steps[si];
	uint32_t status = JS_INTERNAL, lens[2] = {0, 0};
	int err = 0, wall_out = 0, over = 0, killfail = 0;
	char what[16] = "";
	struct jrun r = {0};
	uint8_t *bufs[2] = {NULL, NULL};
	int out[2][2] = {{-1, -1}, {-1, -1}}, ep[2] = {-1, -1}, in = -1;
	uint64_t t0 = mono_us(), wall_us = 0;

	for (int i = 0; i < 2; i++) {
		bufs[i] = big_alloc(s->out_cap + 1);
		if (!bufs[i] || pipe2(out[i], O_CLOEXEC) < 0) {
			err = errno ? errno : ENOMEM;
			strcpy(what, "pipe");
			goto done;
		}
		fcntl(out[i][0], F_SETFL, O_NONBLOCK);
	}
	if (pipe2(ep, O_CLOEXEC) < 0) {
		err = errno;
		strcpy(what, "pipe");
		goto done;
	}
	/* Standard input from a memfd: any size, and no writer to keep fed. */
	if (s->stdin_len) {
		in = (int)syscall(SYS_memfd_create, "stdin", MFD_CLOEXEC);
		const uint8_t *d = s->stdin_data;
		uint32_t n = s->stdin_len;
		while (in >= 0 && n) {
			ssize_t w = write(in, d, n);
			if (w <= 0)
				break;
			d += w;
			n -= (uint32_t)w;
		}
		if (in < 0 || n || lseek(in, 0, SEEK_SET) < 0) {
			err = errno;
			strcpy(what, "stdin");
			goto done;
		}
	} else if ((in = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
		err = errno;
		strcpy(what, "stdin");
		goto done;
	}
	t0 = mono_us();
	r.pid = fork();
	if (r.pid < 0) {
		err = errno;
		strcpy(what, "fork");
		goto done;
	}
	if (r.pid == 0) {
		close(ep[0]);
		int fds[3] = {in, out[0][1], out[1][1]};
		job_child(j, s, res, fds, ep[1]);
	}
	nrunning++;
	close(ep[1]);
	ep[1] = -1;
	close(out[0][1]);
	close(out[1][1]);
	out[0][1] = out[1][1] = -1;

	/* The setup report: EOF once exec succeeded (CLOEXEC). */
	struct child_err ce;
	ssize_t ne;
	while ((ne = read(ep[0], &ce, sizeof(ce))) < 0 && errno == EINTR)
		;
	if (ne == (ssize_t)sizeof(ce)) {
		err = ce.err;
		memcpy(what, ce.step, sizeof(ce.step));
		what[sizeof(ce.step)] = 0;
	}
	uint64_t deadline = t0 + s->wall_ms * 1000;
	while (!err && !r.reaped) {
		struct pollfd pf[3] = {{sfd, POLLIN, 0}, {out[0][0], POLLIN, 0}, {out[1][0], POLLIN, 0}};
		uint64_t now = mono_us();
		if (now >= deadline) {
			wall_out = 1;
			break;
		}
		uint64_t left = deadline - now;
		struct timespec ts = {(time_t)(left / 1000000), (long)(left % 1000000) * 1000};
		if (ppoll(pf, 3, &ts, NULL) < 0 && errno != EINTR)
			break;
		if (pf[0].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof(si)) == sizeof(si))
				;
		}
		for (int i = 0; i < 2; i++)
			if (out[i][0] >= 0 && pf[i + 1].revents && (job_read(&out[i][0], bufs[i], &lens[i], s->out_cap), lens[i] > s->out_cap))
				over = 1;
		if (over)
			break;
		job_reap(&r);
	}
	wall_us = mono_us() - t0;
	/* Whatever the step left running goes now; its output so far is in
	 * the pipes, whose last writers are then gone. */
	if (job_kill_all(&r) < 0)
		killfail = 1;
	if (!r.reaped && !killfail)
		killfail = 1; /* not PID 1, and the step outlived its group kill */
	for (int i = 0; i < 2; i++)
		if (out[i][0] >= 0) {
			job_read(&out[i][0], bufs[i], &lens[i], s->out_cap);
			if (lens[i] > s->out_cap)
				over = 1;
		}
	uint64_t cpu_us = 0;
	if (r.reaped) {
		cpu_us = (uint64_t)r.ru.ru_utime.tv_sec * 1000000 + r.ru.ru_utime.tv_usec +
			 (uint64_t)r.ru.ru_stime.tv_sec * 1000000 + r.ru.ru_stime.tv_usec;
	}
	if (err) {
		status = strcmp(what, "filein") == 0 || strcmp(what, "exec") == 0 || strcmp(what, "chdir") == 0 ? JS_FILE : JS_INTERNAL;
	} else if (!r.reaped) {
		status = JS_INTERNAL;
		err = ESRCH;
		strcpy(what, "wait");
	} else {
		status = job_status(s, &r, wall_out, over, cpu_us);
	}
	if (wall_out && !err && status != JS_OUTPUT)
		status = JS_TIME;
	if (!err && (status == JS_ACCEPTED || status == JS_NONZERO || status == JS_SIGNALLED) && job_disk_full(j)) {
		status = JS_OUTPUT;
		err = ENOSPC;
		strcpy(what, "disk");
	}

done:
	if (r.pid > 0)
		nrunning--;
	for (int i = 0; i < 2; i++)
		for (int k = 0; k < 2; k++)
			if (out[i][k] >= 0)
				close(out[i][k]);
	if (ep[0] >= 0)
		close(ep[0]);
	if (ep[1] >= 0)
		close(ep[1]);
	if (in >= 0)
		close(in);
	int st = r.status;
	jb32(res, status);
	jb32(res, r.reaped && WIFEXITED(st) ? (uint32_t)WEXITSTATUS(st) : (uint32_t)-1);
	jb32(res, r.reaped && WIFSIGNALED(st) ? (uint32_t)WTERMSIG(st) : 0);
	jb64(res, r.reaped ? (uint64_t)r.ru.ru_utime.tv_sec * 1000000 + r.ru.ru_utime.tv_usec +
				     (uint64_t)r.ru.ru_stime.tv_sec * 1000000 + r.ru.ru_stime.tv_usec
			   : 0);
	jb64(res, wall_us);
	jb64(res, r.reaped ? (uint64_t)r.ru.ru_maxrss * 1024 : 0);
	jb32(res, (lens[0] > s->out_cap ? 1u : 0) | (lens[1] > s->out_cap ? 2u : 0));
	jb32(res, (uint32_t)err);
	jbbytes(res, what, (uint32_t)strlen(what) + 1);
	for (int i = 0; i < 2; i++) {
		uint32_t n = lens[i] > s->out_cap ? (uint32_t)s->out_cap : lens[i];
		jb32(res, n);
		jbbytes(res, bufs[i], n);
		if (bufs[i])
			big_free(bufs[i], s->out_cap + 1);
	}
	/* Output files, read whatever the status (a judge may want a partial
	 * one); a missing one fails an otherwise accepted step. */
	int wfd = open(j->workdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	uint32_t nfail = 0;
	jb32(res, s->nout);
	for (uint32_t k = 0; k < s->nout; k++) {
		uint8_t *ep4 = jb_reserve(res, 4);
		int e = wfd < 0 ? errno : job_read_out(wfd, s->out[k], s->fout_cap, res, &s->out_off[k], &s->out_len[k]);
		if (e) {
			jb32(res, 0); /* an empty file */
			nfail++;
		}
		s->out_err[k] = e;
		if (ep4)
			put32(ep4, (uint32_t)e);
	}
	if (wfd >= 0)
		close(wfd);
	if (nfail && status == JS_ACCEPTED)
		return -2; /* the caller patches the status to JS_FILE */
	if (killfail)
		return -1;
	return (int)status;
}

/* Sends n bytes of p on the blocking-or-not socket fd, waiting for the
 * client to take them (a step's result may be megabytes). */
static int job_send(int fd, const uint8_t *p, uint32_t n)
{
	for (uint32_t sent = 0; sent < n;) {
		ssize_t w = send(fd, p + sent, n - sent, MSG_NOSIGNAL);
		if (w > 0) {
			sent += (uint32_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN) {
			struct pollfd pf = {fd, POLLOUT, 0};
			if (poll(&pf, 1, 10000) > 0)
				continue;
		}
		return -1;
	}
	return 0;
}

/* Sends the step result res holds from at on: one 'k' frame. */
static int job_send_step(int fd, const struct jbuf *res, uint32_t at)
{
	uint8_t hdr[HDR_LEN];
	put32(hdr, res->len - at);
	hdr[4] = 'k';
	return job_send(fd, hdr, HDR_LEN) < 0 ? -1 : job_send(fd, res->p + at, res->len - at);
}

/* Runs the job of c's JOB frame and replies with one 'k' frame per step
 * as it ends and a 'j' frame after the reset (or FAILED when the frame is
 * malformed): a client that loses the agent mid-job keeps the results of
 * the steps that ended. */
static void run_job(struct conn *c)
{
	struct job j = {0};
	if (getpid() != 1) {
		/* kill(-1) and the reset are only safe as a sandbox's PID 1. */
		fail(c, EPERM, "job");
		return;
	}
	if (job_parse(c, &j) < 0) {
		if (j.mem)
			big_free(j.mem, j.memlen);
		fail(c, EINVAL, "proto");
		return;
	}
	struct jbuf res = {big_alloc(HDR_LEN + MAX_PAYLOAD), HDR_LEN, HDR_LEN + MAX_PAYLOAD, 0};
	if (!res.p) {
		big_free(j.mem, j.memlen);
		fail(c, ENOMEM, "job");
		return;
	}
	/* The first job of a sandbox makes its work directory. */
	if (mkdir(j.workdir, 0755) == 0 && chown(j.workdir, j.uid, j.gid) < 0)
		rmdir(j.workdir);
	jb32(&res, 0); /* steps run */
	jb32(&res, 0); /* reset errno */
	uint32_t ran = 0;
	int reset_err = 0, client = 1;
	for (uint32_t i = 0; i < j.nsteps; i++) {
		uint32_t at = res.len;
		int st = job_step(&j, i, &res);
		ran++;
		if (st == -2) {
			if (!res.full)
				put32(res.p + at, JS_FILE);
			st = JS_FILE;
		}
		/* A client gone takes no more frames; the job still ends with
		 * the reset. A full buffer fails the job below. */
		if (client && !res.full && job_send_step(c->fd, &res, at) < 0)
			client = 0;
		if (st == -1) {
			reset_err = ESRCH; /* processes that would not die */
			break;
		}
		if (st != JS_ACCEPTED && !(j.steps[i].flags & JF_CONTINUE))
			break;
	}
	if (!reset_err)
		reset_err = job_reset(&j);
	put32(res.p + HDR_LEN, ran);
	put32(res.p + HDR_LEN + 4, (uint32_t)reset_err);
	big_free(j.mem, j.memlen);
	if (res.full) {
		big_free(res.p, HDR_LEN + MAX_PAYLOAD);
		fail(c, E2BIG, "job");
		return;
	}
	put32(res.p, 8);
	res.p[4] = 'j';
	if (client)
		job_send(c->fd, res.p, HDR_LEN + 8);
	big_free(res.p, HDR_LEN + MAX_PAYLOAD);
	drop(c, 0);
}

/* Act on the complete frame in c. Anything unexpected fails the
 * connection (and so kills its process). */
static void handle_frame(struct conn *c)
{
	uint8_t type = c->hdr[4];
	if (c->bad || (type != 'E' && c->nfds)) {
		fail(c, EINVAL, "proto");
		return;
	}
	if (type == 'E') {
		start_exec(c); /* consumes the frame or drops the connection */
		return;
	}
	if (type == 'J' && c->state == C_IDLE) {
		run_job(c); /* replies and drops the connection */
		return;
	}
	if (c->state == C_IDLE && type && strchr("LAICKWD", type)) {
		int r = bproc_request(c, type);
		if (r < 0)
			fail(c, EINVAL, "proto");
		else if (r == 0)
			reset_frame(c);
		return;
	}
	if (type == 'P' && c->plen == 0) {
		uint8_t p[8];
		put32(p, PROTO_VERSION);
		put32(p + 4, nrunning);
		if (send_frame(c, 'p', p, 8) < 0) {
			drop(c, 1);
			return;
		}
	} else if (type == 'S' && c->plen == 5 && (c->state == C_STARTING || c->state == C_RUNNING)) {
		/* The pid is ours until reaped, so it cannot name a stranger.
		 * No reply: signalling a process that just exited is a no-op. */
		if (!c->reaped)
			kill(c->payload[4] ? -c->pid : c->pid, (int)get32(c->payload));
	} else {
		fail(c, EINVAL, "proto");
		return;
	}
	reset_frame(c);
}

/* recv into buf, collecting any SCM_RIGHTS fds into c->fds. */
static ssize_t recv_fds(struct conn *c, void *buf, size_t len)
{
	char cbuf[CMSG_SPACE(sizeof(int) * 4)]; /* one spare slot detects abuse */
	struct iovec iov = {buf, len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1,
			   .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	ssize_t n = recvmsg(c->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0)
		return n;
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
		if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
			continue;
		int *fds = (int *)CMSG_DATA(h);
		for (size_t k = 0; k < (h->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++) {
			if (c->nfds < 3) {
				c->fds[c->nfds++] = fds[k];
			} else {
				close(fds[k]);
				c->bad = 1;
			}
		}
	}
	if (m.msg_flags & MSG_CTRUNC)
		c->bad = 1;
	return n;
}

/* Receive at most one frame per readiness event: level-triggered epoll
 * brings us back, and other connections get their turn. */
static void on_sock(struct conn *c)
{
	for (;;) {
		uint8_t *dst;
		size_t want;
		if (c->hgot < HDR_LEN) {
			dst = c->hdr + c->hgot;
			want = HDR_LEN - c->hgot;
		} else {
			dst = c->payload + c->pgot;
			want = c->plen - c->pgot;
		}
		if (want) {
			ssize_t n = recv_fds(c, dst, want);
			if (n < 0 && (errno == EAGAIN || errno == EINTR))
				return;
			if (n <= 0) {
				drop(c, 1); /* client closed or broke: cancel */
				return;
			}
			if (c->hgot < HDR_LEN) {
				c->hgot += n;
				if (c->hgot < HDR_LEN)
					continue;
				c->plen = get32(c->hdr);
				if (c->plen > MAX_PAYLOAD) {
					fail(c, EINVAL, "proto");
					return;
				}
				c->payload = c->plen <= INLINE_PAYLOAD ? c->inl : big_alloc(c->plen);
				if (!c->payload) {
					fail(c, ENOMEM, "proto");
					return;
				}
			} else {
				c->pgot += n;
			}
		}
		if (c->hgot == HDR_LEN && c->pgot == c->plen) {
			handle_frame(c);
			return;
		}
	}
}

static void on_listen(void)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				/* Stop polling the listener until a connection goes
				 * away, instead of spinning on a level-triggered fd. */
				if (epoll_ctl(epfd, EPOLL_CTL_DEL, lfd, NULL) == 0)
					listen_paused = 1;
			}
			return;
		}
		struct conn *c = conn_alloc();
		struct epoll_event ev = {.events = EPOLLIN};
		if (c) {
			c->wsock = (struct watch){W_SOCK, c, NULL};
			c->wpipe = (struct watch){W_PIPE, c, NULL};
			c->fd = fd;
			c->pipefd = -1;
			c->ptm = -1;
			ev.data.ptr = &c->wsock;
		}
		if (!c || epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			close(fd);
			conn_free(c);
			continue;
		}
		c->next = conns;
		if (conns)
			conns->prev = c;
		conns = c;
	}
}

/* Takes the limits to set in every child: "RES:SOFT:HARD" entries,
 * ','-separated, which the init stage checked. The container init stage
 * calls it in place (init_linux.c, apply_rlimits): handing them over in
 * the environment took setenv, whose malloc cost every idle sandbox
 * 8 KiB (a heap page and the page-table pages of musl's malloc groups). */
void warren_agent_child_rlimits(const char *p)
{
	while (p && *p && nchild_rlimits < (int)(sizeof child_rlimits / sizeof child_rlimits[0])) {
		char *end;
		int res = (int)strtol(p, &end, 10);
		if (*end != ':')
			break;
		rlim_t soft = strtoull(end + 1, &end, 10);
		if (*end != ':')
			break;
		rlim_t hard = strtoull(end + 1, &end, 10);
		child_rlimits[nchild_rlimits].res = res;
		child_rlimits[nchild_rlimits].r = (struct rlimit){soft, hard};
		nchild_rlimits++;
		if (*end != ',')
			break;
		p = end + 1;
	}
}

/* An agent started on its own (not by the init stage) may get them in
 * CHILD_RLIMITS_ENV. */
static void load_child_rlimits(void)
{
	const char *p = getenv(CHILD_RLIMITS_ENV);
	if (p) {
		warren_agent_child_rlimits(p);
		unsetenv(CHILD_RLIMITS_ENV);
	}
}

/* Set by the container init stage of a sandbox in a user namespace
 * (init_linux.c, userns_namespaces), whose PID 1 stays dumpable. */
int warren_agent_dumpable;

/* Also entered in place by the container init stage (internal/container/init_linux.c). */
void __attribute__((noreturn)) warren_agent_main(int fd)
{
	prctl(PR_SET_NAME, "warren-init", 0, 0, 0);
	/* Sandbox processes may share our uid: keep them from ptracing us
	 * or opening our fds through /proc/1/fd. (In a user namespace the
	 * capability check keeps them out: see warren_agent_dumpable.) */
	if (!warren_agent_dumpable)
		prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	/* Reap orphans even when we are not PID 1 (tests, nested setups). */
	prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
	unsetenv(AGENT_ENV);
	load_child_rlimits();

	/* Every disposition to default, once: an inherited SIG_IGN (SIGCHLD's
	 * would make children unwaitable, SIGPIPE's or SIGHUP's would pass to
	 * every program) survives exec, and the agent sets none of its own,
	 * so the programs it forks start with defaults without ~64
	 * sigactions per exec. */
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	for (int s = 1; s < NSIG; s++)
		sigaction(s, &dfl, NULL); /* fails harmlessly for KILL, STOP, libc's own */
	sigset_t all, chld;
	sigfillset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	if ((sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC)) < 0)
		fatal("signalfd");

	int acc = 0;
	socklen_t sl = sizeof(acc);
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &sl) < 0 || !acc)
		fatal("listen fd is not a listening socket");
	lfd = fd;
	if (fcntl(lfd, F_SETFD, FD_CLOEXEC) < 0 ||
	    fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK) < 0)
		fatal("fcntl");

	/* Each running process holds a socket (and a pipe while starting):
	 * take the hard limit; children get the original back. */
	if (getrlimit(RLIMIT_NOFILE, &orig_nofile) == 0) {
		struct rlimit r = orig_nofile;
		have_nofile = 1;
		r.rlim_cur = r.rlim_max;
		setrlimit(RLIMIT_NOFILE, &r);
	}

	if ((epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
		fatal("epoll_create1");
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &wlisten};
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev) < 0)
		fatal("epoll_ctl");
	ev.data.ptr = &wsignal;
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, sfd, &ev) < 0)
		fatal("epoll_ctl");

	reap(); /* zombies inherited from whoever exec'd us */
	dl_iterate_phdr(trim_segments, NULL);
	drop_mappings();
#ifdef WARREN_AGENT_MAIN
	trim_stack();
#endif
	for (;;) {
		struct epoll_event evs[32];
		int n = epoll_wait(epfd, evs, 32, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			fatal("epoll_wait");
		}
		for (int i = 0; i < n; i++) {
			struct watch *w = evs[i].data.ptr;
			switch (w->kind) {
			case W_LISTEN:
				on_listen();
				break;
			case W_SIGNAL:
				reap();
				break;
			case W_SOCK:
				if (w->c->fd >= 0 && (evs[i].events & EPOLLOUT) && w->c->plen_out)
					pump(w->c);
				if (w->c->fd >= 0 && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
					on_sock(w->c);
				break;
			case W_OUT:
				if (w->bp->out.fd >= 0)
					on_output(w->bp, &w->bp->out);
				break;
			case W_ERR:
				if (w->bp->err.fd >= 0)
					on_output(w->bp, &w->bp->err);
				break;
			case W_PIPE:
				if (w->c->pipefd >= 0)
					finish_start(w->c);
				break;
			}
		}
		int freed = dead_conns != NULL;
		while (dead_conns) {
			struct conn *c = dead_conns;
			dead_conns = c->dead;
			conn_free(c);
		}
		while (dead_bprocs) {
			struct bproc *bp = dead_bprocs;
			dead_bprocs = bp->dnext;
			bproc_discard(bp);
		}
#ifdef WARREN_AGENT_MAIN
		if (freed && !conns)
			trim_stack(); /* idle again */
#else
		(void)freed;
#endif
	}
}

/* Entered by the container init stage (internal/container/init_linux.c)
 * once the sandbox is set up, in the same process. */
void __attribute__((noreturn)) warren_agent_start(int fd)
{
#ifdef WARREN_AGENT_MAIN
	run_on_own_stack(fd);
#else
	warren_agent_main(fd);
#endif
}

/* Runs before the Go runtime starts. Without the env var this is an
 * ordinary warren process and we return at once. */
__attribute__((constructor)) static void warren_agent_init(void)
{
	const char *s = getenv(AGENT_ENV);
	if (!s)
		return;
	char *end;
	errno = 0;
	long fd = strtol(s, &end, 10);
	if (errno || end == s || *end || fd < 0 || fd > 1 << 20) {
		errno = EINVAL;
		fatal(AGENT_ENV);
	}
	warren_agent_start((int)fd);
}

#ifdef WARREN_AGENT_MAIN
/* The standalone agent (internal/agentbin), which also carries the
 * container init stage: a constructor (this file's or init_linux.c's) does
 * the work; reaching main means the environment named neither. */
int main(void)
{
	errno = EINVAL;
	fatal(AGENT_ENV " (or _WARREN_CONTAINER_INIT) is not set");
}
#endif
