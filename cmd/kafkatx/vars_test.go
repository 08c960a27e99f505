package main

import (
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/kafkatx/kafkatx/outbox/relay"
	"github.com/kafkatx/kafkatx/retention"
)

// TestRelayFlagDefaultsAreThePackagesDefaults checks that `kafkatx relay` with no flags sets
// each relay and retention field to the default its package declares, and that the help
// shows that value, so a changed package default cannot leave a stale literal in a tag.
func TestRelayFlagDefaultsAreThePackagesDefaults(t *testing.T) {
	var cli CLI
	parser, err := kong.New(&cli, kong.Name("kafkatx"), cliVars())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parser.Parse([]string{"relay"}); err != nil {
		t.Fatal(err)
	}
	c := cli.Relay
	want := map[string]struct{ got, want any }{
		"batch-size":            {c.BatchSize, relay.DefaultBatchSize},
		"poll-interval":         {c.PollInterval, relay.DefaultPollInterval},
		"standby-interval":      {c.StandbyInterval, relay.DefaultStandbyInterval},
		"leader-timeout":        {c.LeaderTimeout, relay.DefaultLeaderTimeout},
		"shutdown-timeout":      {c.ShutdownTimeout, relay.DefaultShutdownTimeout},
		"keep-published":        {c.KeepPublished, relay.DefaultKeepPublished},
		"attempts-retention":    {c.AttemptsRet, retention.DefaultAttemptsRetention},
		"dead-letter-retention": {c.DeadLetterRet, retention.DefaultDeadLetterRetention},
	}
	for flag, w := range want {
		if w.got != w.want {
			t.Errorf("--%s defaults to %v, the package's default is %v", flag, w.got, w.want)
		}
	}
	// The tags must name the packages' values, not restate them.
	for _, n := range parser.Model.Children {
		if n.Name != "relay" {
			continue
		}
		for _, f := range n.Flags {
			if _, ok := want[f.Name]; !ok {
				continue
			}
			if tag := f.Tag.Get("default"); len(tag) < 3 || tag[:2] != "${" {
				t.Errorf("--%s: default tag %q restates a value; name the package's default as ${...} (cliVars)", f.Name, tag)
			}
		}
	}
	for d, s := range map[time.Duration]string{0: "0s", time.Second: "1s", time.Minute: "1m", 168 * time.Hour: "168h", 90 * time.Second: "1m30s", 250 * time.Millisecond: "250ms"} {
		if got := flagDuration(d); got != s {
			t.Errorf("flagDuration(%v) = %q, want %q", d, got, s)
		}
	}
}
