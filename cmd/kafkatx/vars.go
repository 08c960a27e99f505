package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/kafkatx/kafkatx/cmd/kafkatx/console"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/outbox/relay"
	"github.com/kafkatx/kafkatx/pg"
	"github.com/kafkatx/kafkatx/retention"
)

// cliVars are the values the flags' tags name as ${name}: the packages' defaults, so a flag's
// default cannot drift from the default of the field it sets.
func cliVars() kong.Vars {
	return kong.Vars{
		"default_schema":         pg.DefaultSchema,
		"outbox_modes":           outbox.ModeNames(","),
		"relay_batch_size":       strconv.Itoa(relay.DefaultBatchSize),
		"relay_poll_interval":    flagDuration(relay.DefaultPollInterval),
		"relay_standby_interval": flagDuration(relay.DefaultStandbyInterval),
		"relay_leader_timeout":   flagDuration(relay.DefaultLeaderTimeout),
		"relay_read_timeout":     flagDuration(relay.DefaultReadTimeout),
		"relay_shutdown_timeout": flagDuration(relay.DefaultShutdownTimeout),
		"relay_keep_published":   flagDuration(relay.DefaultKeepPublished),
		"attempts_retention":     flagDuration(retention.DefaultAttemptsRetention),
		"dead_letter_retention":  flagDuration(retention.DefaultDeadLetterRetention),
		"redrive_rate":           strconv.Itoa(console.RedriveRateDefault),
		"redrive_rate_max":       strconv.Itoa(console.MaxRedriveRate),
	}
}

// flagDuration writes d as a flag value, without time.Duration.String's zero units: 168h,
// not 168h0m0s.
func flagDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
