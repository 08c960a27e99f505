// Package devservices tests scripts/dev-services itself, on a copy of the scripts in a
// temporary directory (its own .dev state, data and ports), so the broker the other tests use
// is never touched.
package devservices

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/internal/testenv"
)

type devServices struct {
	t    *testing.T
	repo string
}

func (d *devServices) run(args ...string) (stdout, stderr string, code int) {
	d.t.Helper()
	return d.runEnv(nil, args...)
}

// runEnv is run with env added to the environment.
func (d *devServices) runEnv(env []string, args ...string) (stdout, stderr string, code int) {
	d.t.Helper()
	cmd := exec.Command(filepath.Join(d.repo, "scripts", "dev-services"), args...)
	cmd.Env = append(append(os.Environ(), "KAFKA_BOOTSTRAP_SERVERS=", "DATABASE_URL=", "KAFKA_HEAP_OPTS=-Xms128m -Xmx256m"), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatal(err)
	}
	d.t.Logf("dev-services %s → exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return out.String(), errOut.String(), code
}

func (d *devServices) state(name string) string {
	b, _ := os.ReadFile(filepath.Join(d.repo, ".dev", "state", name))
	return strings.TrimSpace(string(b))
}

// setup copies scripts/ into a temporary repository that shares the cached Kafka jars.
func setup(t *testing.T) *devServices {
	t.Helper()
	testenv.FullTier(t, "starts and kills brokers of its own through scripts/dev-services")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// Each version's jars are cached in .dev/kafka/libs-<version>.
	libs, _ := filepath.Glob(filepath.Join(root, ".dev", "kafka", "libs-*", ".complete"))
	if len(libs) == 0 {
		testenv.Unavailable(t, "no cached Kafka jars in %s (scripts/dev-services up fetches them)", filepath.Join(root, ".dev", "kafka", "libs-<version>"))
	}
	repo := t.TempDir()
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "scripts"), repo).CombinedOutput(); err != nil {
		t.Fatalf("copy scripts: %v\n%s", err, out)
	}
	if err := os.MkdirAll(filepath.Join(repo, ".dev", "kafka"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range libs {
		dir := filepath.Dir(l)
		if err := os.Symlink(dir, filepath.Join(repo, ".dev", "kafka", filepath.Base(dir))); err != nil {
			t.Fatal(err)
		}
	}
	d := &devServices{t: t, repo: repo}
	// `down` with no service named stops all the copy started: `up kafka secure` starts
	// PostgreSQL too (an extra needs both), which `down kafka` left running after the test
	// (a PostgreSQL under /var/tmp/kafkatx-dev-<hash of the temporary path> per run).
	t.Cleanup(func() {
		base := d.state("pg.base")
		d.run("down")
		if base == "" {
			return
		}
		if b, err := os.ReadFile(filepath.Join(base, "data", "postmaster.pid")); err == nil && pidAlive(strings.SplitN(string(b), "\n", 2)[0]) {
			t.Errorf("the copy's PostgreSQL (%s) is still running after down", base)
		}
		// As root the cluster lives outside the temporary repository, under /var/tmp.
		if dir := filepath.Dir(base); strings.HasPrefix(dir, "/var/tmp/kafkatx-dev-") {
			_ = os.RemoveAll(dir)
		}
	})
	return d
}

// Issue "liveness" 9: `up` could not restart a crashed broker with its data (it reformatted
// storage on new ports) and `env` stopped exporting the broker once its process was gone. Now
// a broker killed with SIGKILL is reported as crashed, keeps its address in `env`, and `up`
// resumes it on its data and ports: its topics and records are still there.
func TestCrashedBrokerResumesOnItsDataAndPorts(t *testing.T) {
	t.Parallel()
	d := setup(t)
	if _, _, code := d.run("up", "kafka"); code != 0 {
		t.Fatalf("up kafka exited %d", code)
	}
	bootstrap := d.state("kafka.bootstrap")
	topic := "devservices-resume"
	produce(t, bootstrap, topic, 3)

	pid := d.state("kafka.pid")
	var p int
	if _, err := fmt.Sscan(pid, &p); err != nil {
		t.Fatalf("kafka.pid %q: %v", pid, err)
	}
	if err := syscall.Kill(p, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50 && syscall.Kill(p, 0) == nil; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	out, _, code := d.run("status", "kafka")
	if code == 0 || !strings.Contains(out, "crashed") || !strings.Contains(out, bootstrap) {
		t.Fatalf("status of a crashed broker: exit %d, %q", code, out)
	}
	out, _, _ = d.run("env", "kafka")
	if !strings.Contains(out, "export KAFKA_BOOTSTRAP_SERVERS='"+bootstrap+"'") {
		t.Fatalf("env of a crashed broker does not keep its address %s: %q", bootstrap, out)
	}
	if _, errOut, code := d.run("up", "kafka"); code != 0 || !strings.Contains(errOut, "resuming") {
		t.Fatalf("up after the crash: exit %d, %q", code, errOut)
	}
	if got := d.state("kafka.bootstrap"); got != bootstrap {
		t.Fatalf("the resumed broker listens at %s, want its old address %s", got, bootstrap)
	}
	if out, _, _ := d.run("status", "kafka"); !strings.Contains(out, "resumed") {
		t.Fatalf("status does not say the broker resumed on its data: %q", out)
	}
	if high := endOffset(t, bootstrap, topic); high != 3 {
		t.Fatalf("after the restart the topic's end offset is %d, want the 3 records written before the crash", high)
	}
}

// Issue 16: the broker's storage was keyed by listener configuration only, so a broker of
// another KAFKA_VERSION started on storage that version had not written, and a changed broker
// setting was ignored by a resumed broker. Now storage is keyed by version and listener
// configuration, and resumed only under the server.properties that formatted it: switching
// version formats the other version's storage, switching back resumes the first one with its
// records, and a changed setting reformats.
func TestSwitchingKafkaVersionsFormatsItsOwnStorageAndSwitchingBackResumes(t *testing.T) {
	t.Parallel()
	d := setup(t)
	main := mainVersion(t)
	other := os.Getenv("KAFKA2_VERSION")
	if other == "" || other == main {
		other = "4.1.2"
	}
	if other == main {
		other = "4.3.1"
	}
	root, _ := filepath.Abs("../..")
	if _, err := os.Stat(filepath.Join(root, ".dev", "kafka", "libs-"+other, ".complete")); err != nil {
		testenv.Unavailable(t, "no cached jars of Kafka %s (scripts/dev-services up kafka2 fetches them)", other)
	}
	onMain, onOther := []string{"KAFKA_VERSION=" + main}, []string{"KAFKA_VERSION=" + other}
	if _, _, code := d.runEnv(onMain, "up", "kafka"); code != 0 {
		t.Fatalf("up kafka %s exited %d", main, code)
	}
	bootstrap := d.state("kafka.bootstrap")
	topic := "devservices-switch"
	produce(t, bootstrap, topic, 3)
	d.run("down", "kafka")

	if _, errOut, code := d.runEnv(onOther, "up", "kafka"); code != 0 || strings.Contains(errOut, "resuming") {
		t.Fatalf("up kafka %s after %s: exit %d, %q; want a fresh start on its own storage", other, main, code, errOut)
	}
	if v, st := d.state("kafka.version"), d.state("kafka.storage"); v != other || st != "fresh" {
		t.Fatalf("after switching to %s the broker runs %s on %s storage", other, v, st)
	}
	d.run("down", "kafka")

	if _, errOut, code := d.runEnv(onMain, "up", "kafka"); code != 0 || !strings.Contains(errOut, "resuming") {
		t.Fatalf("up kafka %s again: exit %d, %q; want its storage resumed", main, code, errOut)
	}
	if v := d.state("kafka.version"); v != main {
		t.Fatalf("switched back, the broker runs %s, want %s", v, main)
	}
	if high := endOffset(t, d.state("kafka.bootstrap"), topic); high != 3 {
		t.Fatalf("switched back to %s, the topic's end offset is %d, want the 3 records written on it", main, high)
	}
	d.run("down", "kafka")

	// A broker setting that differs from what formatted the storage: formatted afresh.
	conf := filepath.Join(d.repo, ".dev", "kafka", "server-"+main+"-plain.properties")
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("# a setting this script no longer writes\n")
	f.Close()
	if _, errOut, code := d.runEnv(onMain, "up", "kafka"); code != 0 || !strings.Contains(errOut, "changed") || d.state("kafka.storage") != "fresh" {
		t.Fatalf("up after a settings change: exit %d, storage %s, %q; want a fresh format", code, d.state("kafka.storage"), errOut)
	}
}

// mainVersion is the Kafka version the main broker runs: KAFKA_VERSION, else the pom's.
func mainVersion(t *testing.T) string {
	if v := os.Getenv("KAFKA_VERSION"); v != "" {
		return v
	}
	b, err := os.ReadFile("../../scripts/kafka/pom.xml")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "<kafka.version>")
	j := strings.Index(s, "</kafka.version>")
	if i < 0 || j < i {
		t.Fatal("no kafka.version in scripts/kafka/pom.xml")
	}
	return s[i+len("<kafka.version>") : j]
}

func produce(t *testing.T, bootstrap, topic string, n int) {
	t.Helper()
	a, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": bootstrap})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := a.CreateTopics(ctx, []kafka.TopicSpecification{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}})
	a.Close()
	if err != nil || res[0].Error.Code() != kafka.ErrNoError {
		t.Fatalf("create topic: %v %v", err, res)
	}
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": bootstrap, "acks": "all", "go.logs.channel.enable": true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ch := make(chan kafka.Event, n)
	for i := 0; i < n; i++ {
		if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: 0}, Value: []byte("x")}, ch); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		if m := (<-ch).(*kafka.Message); m.TopicPartition.Error != nil {
			t.Fatal(m.TopicPartition.Error)
		}
	}
}

func endOffset(t *testing.T, bootstrap, topic string) int64 {
	t.Helper()
	c, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": bootstrap, "group.id": "devservices-check", "go.logs.channel.enable": true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var high int64 = -1
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var err error
		_, high, err = c.QueryWatermarkOffsets(topic, 0, 5000)
		if err == nil {
			return high
		}
		time.Sleep(time.Second)
	}
	return high
}

// pidAlive reports whether the process with the decimal pid s exists.
func pidAlive(s string) bool {
	var p int
	if _, err := fmt.Sscan(s, &p); err != nil || p <= 0 {
		return false
	}
	return syscall.Kill(p, 0) == nil
}
