package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// EnvBrokerKillTests turns on the tests that SIGKILL this worktree's development broker
// (KillBroker). They are off by default because every other test of a parallel `go test`
// run meets the outage too; `make test-outages` runs them alone.
const EnvBrokerKillTests = "KAFKATX_BROKER_KILL_TESTS"

// EnvBrokerKillService names the scripts/dev-services extra that runs the broker KillBroker
// kills, for KillBroker to bring it back with `scripts/dev-services up NAME`: "outage" (the
// broker of its own that `make test` gives test-outages, so they run beside the main suite).
// Unset: the main development broker (`scripts/dev-services up`).
const EnvBrokerKillService = "KAFKATX_BROKER_KILL_SERVICE"

// KillRounds is how many times a test that rides out repeated broker outages kills the broker
// (KillBroker): three — the first outage proves the recovery, the next ones that it recovers
// again from the state the last recovery left (a new Kafka client, a rejoined member, resumed
// partitions). Each round costs a broker restart (20 to 60 s on a loaded 2-core machine); ten
// rounds made test-outages the longest stage of `make test`.
const KillRounds = 3

// NeedBrokerKills skips a test that kills the broker unless EnvBrokerKillTests is set, saying
// so.
func NeedBrokerKills(t testing.TB) {
	t.Helper()
	FullTier(t, "kills or freezes the broker (make test-outages)")
	if os.Getenv(EnvBrokerKillTests) == "" {
		t.Skipf("%s is not set: this test SIGKILLs the shared development broker; `make test-outages` runs it alone", EnvBrokerKillTests)
	}
}

// KillBroker SIGKILLs the broker listening on brokers' first address (the JVM of
// scripts/dev-services), waits down, and starts it again with `scripts/dev-services up`
// (`up NAME` when EnvBrokerKillService names the extra that runs it), returning once it listens. The broker's data survive (the same storage directory).
func KillBroker(t testing.TB, brokers string, down time.Duration) {
	t.Helper()
	first := strings.Split(brokers, ",")[0]
	port := first[strings.LastIndexByte(first, ':')+1:]
	pid := listenerPID(port)
	if pid == 0 {
		t.Fatalf("no process listens on the broker's port %s", port)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL the broker (pid %d): %v", pid, err)
	}
	for i := 0; i < 100 && listenerPID(port) != 0; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(down)
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"up"}
	if svc := os.Getenv(EnvBrokerKillService); svc != "" {
		args = append(args, svc)
	}
	cmd := exec.Command(root+"/scripts/dev-services", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/dev-services %s after killing the broker: %v\n%s", strings.Join(args, " "), err, out)
	}
	if listenerPID(port) == 0 {
		t.Fatalf("the broker does not listen on %s after scripts/dev-services up", port)
	}
}

// listenerPID finds the process listening on TCP port (with ss), or 0.
func listenerPID(port string) int {
	out, err := exec.Command("ss", "-ltnpH", fmt.Sprintf("sport = :%s", port)).Output()
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

// FreezeBroker SIGSTOPs the broker listening on brokers' first address (the JVM of
// scripts/dev-services: the combined KRaft broker and controller), holds it frozen for d and
// SIGCONTs it — a broker paused (a GC pause, a suspended VM) rather than gone: its sockets stay
// open and every request to it waits. The broker is resumed when the test ends even if it
// fails meanwhile.
func FreezeBroker(t testing.TB, brokers string, d time.Duration) {
	t.Helper()
	resume := StopBroker(t, brokers)
	time.Sleep(d)
	resume()
}

// StopBroker SIGSTOPs the broker as FreezeBroker does and returns the function that SIGCONTs
// it (also called when the test ends; calling it twice is harmless).
func StopBroker(t testing.TB, brokers string) (resume func()) {
	t.Helper()
	first := strings.Split(brokers, ",")[0]
	port := first[strings.LastIndexByte(first, ':')+1:]
	pid := listenerPID(port)
	if pid == 0 {
		t.Fatalf("no process listens on the broker's port %s", port)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP the broker (pid %d): %v", pid, err)
	}
	resume = func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(resume)
	return resume
}
