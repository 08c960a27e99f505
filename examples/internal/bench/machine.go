package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on Linux.
const clockTicks = 100

// procCPU returns the user+system CPU time the process pid has used, from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, bool) {
	st, ok := readStat(pid)
	return st.self, ok
}

// procStat is what the bench reads from /proc/<pid>/stat.
type procStat struct {
	ppid     int
	self     time.Duration // utime + stime
	children time.Duration // cutime + cstime: children that ended and were waited for
}

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	return parseStat(string(b))
}

// parseStat parses a /proc/<pid>/stat line (proc(5)): fields after the command name, which
// may hold spaces and parentheses, start after the last ')'.
func parseStat(s string) (procStat, bool) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return procStat{}, false
	}
	n := func(j int) int64 { v, _ := strconv.ParseInt(f[j], 10, 64); return v }
	tick := func(v int64) time.Duration { return time.Duration(v) * time.Second / clockTicks }
	ppid, _ := strconv.Atoi(f[1])                                                               // field 4
	return procStat{ppid: ppid, self: tick(n(11) + n(12)), children: tick(n(13) + n(14))}, true // fields 14-17
}

// treeCPU is the CPU time of process pid and its children, live (their utime+stime) and
// ended (pid's cutime+cstime): for the PostgreSQL postmaster, the whole server — backends
// that came and went included.
func treeCPU(pid int) (time.Duration, bool) {
	root, ok := readStat(pid)
	if !ok {
		return 0, false
	}
	sum := root.self + root.children
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		if st, ok := readStat(child); ok && st.ppid == pid {
			sum += st.self
		}
	}
	return sum, true
}

// machineCPU returns the machine's busy and total CPU time so far in USER_HZ ticks, from
// /proc/stat's first line (busy: all but idle and iowait).
func machineCPU() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return parseCPULine(line)
}

// parseCPULine parses /proc/stat's "cpu user nice system idle iowait irq softirq steal ..."
// (guest times are already inside user and nice, so only the first eight count).
func parseCPULine(line string) (busy, total int64) {
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	for i := 1; i < len(f) && i <= 8; i++ {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		total += v
		if i != 4 && i != 5 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

func numCPU() int { return runtime.NumCPU() }

// selfCPU is this process's user+system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendCPU sums the CPU time of the PostgreSQL backends whose application_name is app
// (the server must run on this machine and its /proc be readable; else 0, false).
func backendCPU(ctx context.Context, conn interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, app string) (time.Duration, bool) {
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return 0, false
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return 0, false
	}
	var sum time.Duration
	for _, pid := range pids {
		d, ok := procCPU(int(pid))
		if !ok {
			return 0, false
		}
		sum += d
	}
	return sum, true
}

// brokerPID finds the process listening on the bootstrap server's port (with ss), or 0.
func brokerPID(bootstrap string) int {
	first := strings.Split(bootstrap, ",")[0]
	return listenerPID(first[strings.LastIndexByte(first, ':')+1:])
}

// listenerPID finds the process listening on TCP port (with ss), or 0.
func listenerPID(port string) int {
	if port == "" {
		return 0
	}
	out, err := exec.Command("ss", "-ltnpH", "sport = :"+port).Output()
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`pid=(\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		return 0
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

// brokerVersion reads the Kafka version from the broker process's class path
// (kafka_<scala>-<version>.jar), or "unknown".
func brokerVersion(pid int) string {
	if pid == 0 {
		return "unknown"
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return "unknown"
	}
	m := regexp.MustCompile(`kafka_[0-9.]+-([0-9][0-9A-Za-z.\-]*?)\.jar`).FindSubmatch(b)
	if m == nil {
		// The class path may be a directory glob; look at the jars there.
		for _, part := range strings.FieldsFunc(string(b), func(r rune) bool { return r == 0 || r == ':' }) {
			if strings.HasSuffix(part, "*") {
				matches, _ := filepath.Glob(strings.TrimSuffix(part, "*") + "kafka_*.jar")
				for _, j := range matches {
					if mm := regexp.MustCompile(`kafka_[0-9.]+-([0-9][0-9A-Za-z.\-]*?)\.jar$`).FindStringSubmatch(j); mm != nil {
						return mm[1]
					}
				}
			}
		}
		return "unknown"
	}
	return string(m[1])
}

// loadAvg returns /proc/loadavg's 1-, 5- and 15-minute load averages.
func loadAvg() [3]float64 {
	var out [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return out
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		out[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return out
}

// memTotalMB is /proc/meminfo's MemTotal in MiB.
func memTotalMB() int {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) >= 2 && fs[0] == "MemTotal:" {
			kb, _ := strconv.Atoi(fs[1])
			return kb / 1024
		}
	}
	return 0
}

// cpuModel is /proc/cpuinfo's first "model name".
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
