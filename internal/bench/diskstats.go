package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// diskDevice is a block device of /proc/diskstats.
type diskDevice struct {
	Name         string
	Major, Minor uint32
}

// deviceOf returns the /proc/diskstats device holding path (the device of
// its filesystem). A filesystem without a block device of its own (tmpfs,
// overlay, a container's root) is an error.
func deviceOf(path string) (diskDevice, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return diskDevice{}, err
	}
	d := diskDevice{Major: unix.Major(uint64(st.Dev)), Minor: unix.Minor(uint64(st.Dev))}
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return d, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 10 {
			continue
		}
		if f[0] == strconv.FormatUint(uint64(d.Major), 10) && f[1] == strconv.FormatUint(uint64(d.Minor), 10) {
			d.Name = f[2]
			return d, nil
		}
	}
	return d, fmt.Errorf("the filesystem of %s (device %d:%d) has no line in /proc/diskstats (not a block device: tmpfs, overlay?)", path, d.Major, d.Minor)
}

// sectorsWritten reads the "sectors written" counter of dev (512-byte
// units, whatever the device's block size).
func sectorsWritten(dev diskDevice) (int64, error) {
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return 0, err
	}
	return parseSectorsWritten(b, dev.Name)
}

func parseSectorsWritten(b []byte, name string) (int64, error) { return parseDiskstat(b, name, 9) }

// parseDiskstat returns field idx of name's line of /proc/diskstats:
// major minor name reads rmerged rsectors rms writes wmerged wsectors ...
func parseDiskstat(b []byte, name string, idx int) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 10 && f[2] == name {
			return strconv.ParseInt(f[idx], 10, 64)
		}
	}
	return 0, fmt.Errorf("device %s not in /proc/diskstats", name)
}

// sectorsRead reads the "sectors read" counter of dev (512-byte units).
func sectorsRead(dev diskDevice) (int64, error) {
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return 0, err
	}
	return parseDiskstat(b, dev.Name, 5)
}

// diskMeter measures the bytes written to one device during a phase and
// the peak write rate over 100 ms samples.
type diskMeter struct {
	dev      diskDevice
	start    int64
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	peakBps  float64
	lastErr  error
	interval time.Duration
}

// startDiskMeter reads the counter and starts sampling every interval.
func startDiskMeter(dev diskDevice, interval time.Duration) (*diskMeter, error) {
	s0, err := sectorsWritten(dev)
	if err != nil {
		return nil, err
	}
	m := &diskMeter{dev: dev, start: s0, stop: make(chan struct{}), done: make(chan struct{}), interval: interval}
	go m.sample(s0)
	return m, nil
}

func (m *diskMeter) sample(prev int64) {
	defer close(m.done)
	t := time.NewTicker(m.interval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-m.stop:
			return
		case now := <-t.C:
			cur, err := sectorsWritten(m.dev)
			m.mu.Lock()
			if err != nil {
				m.lastErr = err
			} else if dt := now.Sub(last).Seconds(); dt > 0 {
				if bps := float64(cur-prev) * 512 / dt; bps > m.peakBps {
					m.peakBps = bps
				}
				prev, last = cur, now
			}
			m.mu.Unlock()
		}
	}
}

// Stop ends the sampling and returns the bytes written since the start
// and the peak rate in bytes per second.
func (m *diskMeter) Stop() (bytes int64, peakBps float64, err error) {
	close(m.stop)
	<-m.done
	end, err := sectorsWritten(m.dev)
	if err != nil {
		return 0, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return (end - m.start) * 512, m.peakBps, m.lastErr
}

// Read returns the bytes written so far without stopping.
func (m *diskMeter) Read() (int64, error) {
	cur, err := sectorsWritten(m.dev)
	return (cur - m.start) * 512, err
}

// mib formats bytes as MiB.
func mib(b int64) string {
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}
