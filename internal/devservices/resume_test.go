package devservices

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// kill9 SIGKILLs the broker the state names and waits until it is gone.
func (d *devServices) kill9() {
	d.t.Helper()
	var p int
	if _, err := fmt.Sscan(d.state("kafka.pid"), &p); err != nil {
		d.t.Fatalf("kafka.pid: %v", err)
	}
	if err := syscall.Kill(p, syscall.SIGKILL); err != nil {
		d.t.Fatal(err)
	}
	for i := 0; i < 50 && syscall.Kill(p, 0) == nil; i++ {
		time.Sleep(100 * time.Millisecond)
	}
}

// Issue "a user's first week" 2: after `make test` (which leaves the broker in its secure
// configuration) a SIGKILLed broker was brought back by `up` in the plain configuration: an
// empty cluster at the same address. Now `up` resumes the configuration that ran, on its data
// and ports (the SASL_SSL one too), and says which; `down secure` makes the next `up` plain.
func TestCrashedSecureBrokerResumesSecureOnItsDataAndPorts(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl not installed: the secure configuration cannot be made")
	}
	d := setup(t)
	if _, _, code := d.run("up", "kafka", "secure"); code != 0 {
		t.Fatalf("up kafka secure exited %d", code)
	}
	bootstrap, securePort := d.state("kafka.bootstrap"), d.state("kafka.secure_port")
	topic := "devservices-secure-resume"
	produce(t, bootstrap, topic, 5)
	d.kill9()

	out, _, _ := d.run("status", "kafka")
	if !strings.Contains(out, "crashed") || !strings.Contains(out, "secure listener configuration") {
		t.Fatalf("status of the crashed secure broker does not say what up brings back: %q", out)
	}
	_, errOut, code := d.run("up", "kafka")
	if code != 0 || !strings.Contains(errOut, "last ran in its secure listener configuration") || !strings.Contains(errOut, "resuming") {
		t.Fatalf("up after the crash: exit %d, want the secure configuration resumed and named:\n%s", code, errOut)
	}
	if m := d.state("kafka.mode"); m != "secure" {
		t.Fatalf("the broker came back %s, want secure", m)
	}
	if got, gotSecure := d.state("kafka.bootstrap"), d.state("kafka.secure_port"); got != bootstrap || gotSecure != securePort {
		t.Fatalf("the broker came back at %s (SASL_SSL port %s), want %s (%s)", got, gotSecure, bootstrap, securePort)
	}
	if high := endOffset(t, bootstrap, topic); high != 5 {
		t.Fatalf("end offset %d after the resume, want the 5 records written before the crash (an empty cluster at the same address)", high)
	}
	if out, _, code := d.run("status", "kafka", "secure"); code != 0 || !strings.Contains(out, "resumed secure storage") || !strings.Contains(out, "secure: running") {
		t.Fatalf("status after the resume: exit %d, %q", code, out)
	}

	// Asked for explicitly, the plain configuration comes back after a crash instead.
	d.kill9()
	if _, errOut, code := d.run("down", "secure"); code != 0 || !strings.Contains(errOut, "plain") {
		t.Fatalf("down secure with the broker crashed: exit %d, %q", code, errOut)
	}
	if _, errOut, code := d.run("up", "kafka"); code != 0 || strings.Contains(errOut, "secure listener configuration") {
		t.Fatalf("up after down secure: exit %d, want the plain configuration:\n%s", code, errOut)
	}
	if m := d.state("kafka.mode"); m != "plain" {
		t.Fatalf("the broker came back %s after down secure, want plain", m)
	}
}
