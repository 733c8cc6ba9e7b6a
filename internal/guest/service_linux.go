package guest

import (
	"encoding/json"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ServiceFlag makes warren-guest run as a service of a full guest OS (the
// fullvm backend's Debian image, under systemd) instead of as the VM's
// init.
const ServiceFlag = "--service"

// serviceConsole is the full VM's serial console, which the host reads
// (its console.log) for the agent's VsockReady.
const serviceConsole = "/dev/ttyS0"

// ServiceMain runs the agent as a service of a booted OS: the OS mounted
// /proc, /dev and the disks, loaded the modules and set the hostname, so
// none of PID 1's setup is done (mounting a tmpfs over systemd's /run
// would hide its sockets). There is no sandbox namespace either: the
// whole VM is the sandbox, commands run in the guest's root as root with
// every capability, the OS's own users and services beside them, in a
// cgroup of their own with the sandbox's memory and pids limits
// (serviceCgroup) that the agent stays out of. The agent is the reaper
// of its commands' orphans (a child subreaper), so their exit statuses
// reach it as in the init role. It returns on a failure; systemd starts
// it again.
func ServiceMain() error {
	log.SetFlags(0)
	log.SetPrefix("warren-guest: ")
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
	}
	// systemd's service limits are the hard ones the commands' would be
	// set under (its nproc of ~1,000 in a small VM): raised to the most
	// here, as the init role does, so a command's trampoline only lowers.
	raiseLimits(nil)
	srv := &server{r: newReaper(), bg: newBGTable(), held: map[int]Rlimit{}, whole: true}
	// The unit says -1000 too (OOMScoreAdjust): said here, the agent
	// started by hand is as safe from the OOM killer.
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	if srv.cg, srv.cgDir, srv.cgErr = serviceCgroup(); srv.cgErr != nil {
		// Commands run unlimited beside the agent, and a limit the host
		// asks for is refused with this reason.
		log.Printf("no cgroup for the commands: %v", srv.cgErr)
	}
	// A VM has one transport: the virtio-serial port or a vsock device.
	// udev loads their drivers when it sees the devices: late on a slow
	// boot.
	port, err := findTransport(5 * time.Minute)
	if err != nil {
		return err
	}
	if port == "" {
		return srv.serveVsock(serviceConsole)
	}
	go srv.watchPorts(port)
	return srv.servePort(port)
}

// findTransport waits for the agent's virtio-serial port (its device
// path) or a vsock device ("").
func findTransport(wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		if port, err := findPort(PortName, 0); err == nil {
			return port, nil
		}
		if hasVsockDevice() {
			return "", nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port %q and no vsock device after %v", PortName, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// guestStats answers the sandbox's counters when the sandbox is the whole
// guest: the kernel's OOM kills, its processes, the memory in use (total
// less available) and every CPU's busy time.
func (s *server) guestStats(st net.Conn) {
	var cs CgroupStats
	cs.OOMKills = guestOOMKills()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			cs.Pids++
		}
	}
	mem := map[string]uint64{}
	b, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			mem[f[0]], _ = strconv.ParseUint(f[1], 10, 64)
		}
	}
	cs.MemoryBytes = (mem["MemTotal:"] - mem["MemAvailable:"]) * 1024
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		var ticks uint64
		for i := 1; i < len(f) && i <= 3; i++ { // user, nice, system
			n, _ := strconv.ParseUint(f[i], 10, 64)
			ticks += n
		}
		cs.CPUUsec = ticks * 10000 // USER_HZ 100
	}
	out, _ := json.Marshal(cs)
	_ = WriteFrame(st, KindExit, out)
}

// guestOOMKills is the guest kernel's count of OOM kills, a cgroup's
// limit's and the whole guest's alike.
func guestOOMKills() uint64 { return keyed("/proc/vmstat", "oom_kill") }
