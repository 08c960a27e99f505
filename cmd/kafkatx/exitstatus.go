package main

import (
	"fmt"
	"strings"
)

// Exit statuses of every subcommand. This file is their one list: `kafkatx --help` prints
// exitStatusHelp (generated from exitStatuses), and TestHelpReadmeAndCodeAgreeOnExitStatuses
// checks the README's table against exitStatusTable.
const (
	exitOK             = 0
	exitFailed         = 1 // the command failed (database or Kafka unreachable, a missing table, ...)
	exitUsage          = 2 // the command line is wrong: one line on stderr says what, --help says more
	offsetsExitDrift   = 3 // offsets status: Kafka and the database disagree; airflow status: the ledger and Airflow disagree
	offsetsExitGap     = 4 // offsets account: a watermark move nothing explains
	offsetsExitActive  = 5 // offsets reset: the group has active members
	exitNotActionable  = 6 // outbox release|discard, dlq show|replay|discard, parked-keys release|dead-letter, shards move --cancel: not in a state the command acts on
	offsetsExitUnknown = 7 // offsets status: the group has no watermark and no committed offset
	offsetsExitStalled = 8 // offsets status: lag with a watermark that has not moved for --stalled-after
	// offsets status: the log behind a watermark is another one (the topic recreated, another
	// cluster: state log_changed); it takes precedence over drift.
	offsetsExitLogChanged = 9
)

// exitStatus is one exit status: what --help says (plain) and what the README's table says
// (Markdown, more detail).
type exitStatus struct {
	code         int
	help, readme string
}

// exitStatuses lists every exit status, in order.
var exitStatuses = []exitStatus{
	{exitOK, "success", "success"},
	{exitFailed, "error (the message on stderr says which)", "error (the message on stderr says which)"},
	{exitUsage, "usage error (unknown command or flag, bad value, invalid --schema, a relay flag that means nothing in the schema's outbox mode)",
		"usage error: unknown command or flag, bad value (out of its range, a negative duration, `--output yaml`, an empty `--reason`, a `--database-url` that does not parse: one line names the flag and what it accepts, never the URL), empty or over-long `--schema` (PostgreSQL identifiers are at most 63 bytes), a `relay` flag that means nothing in the schema's outbox mode (`--poll-interval` in WAL mode)"},
	{offsetsExitDrift, "offsets status: drift (Kafka's committed offset and the database watermark disagree); airflow status: drift (the Airflow ledger and Airflow disagree)",
		"`offsets status`: drift (Kafka's committed offset and the database watermark disagree); `airflow status`: drift (a run or asset event of the Airflow ledger missing in Airflow, queued past `--queued-for`, or failed)"},
	{offsetsExitGap, "offsets account: offsets nothing accounts for", "`offsets account`: offsets nothing accounts for"},
	{offsetsExitActive, "offsets reset: the group has active members (stop the consumers first)", "`offsets reset`: the group has active members"},
	{exitNotActionable, "outbox release|discard, dlq show|replay|discard, parked-keys release|dead-letter: no such row or parked key, or not in a state the command acts on; shards move --cancel: no move in progress, or the move passed its cut-over (finish it)",
		"`outbox release`/`discard`, `dlq show`/`replay`/`discard`, `parked-keys release`/`dead-letter`: no such row or parked key, or not in a state the command acts on; `shards move --cancel`: no move in progress, or the move passed its cut-over (finish it instead)"},
	{offsetsExitUnknown, "offsets status: the group has no watermark and no committed offset; airflow status|repair: the Airflow ledger has no row for the group",
		"`offsets status`: the group has no watermark and no committed offset; `airflow status`/`repair`: the Airflow ledger has no row for the group (and the range given)"},
	{offsetsExitStalled, "offsets status: a partition with lag whose watermark has not moved for --stalled-after",
		"`offsets status`: no drift, but a partition with lag whose watermark has not moved for `--stalled-after` (default 2m): stalled"},
	{offsetsExitLogChanged, "offsets status: the log behind a watermark changed (topic recreated, another cluster): log_changed",
		"`offsets status`: the log behind a watermark changed — the topic was recreated, or the brokers are another cluster (`log_changed`; takes precedence over 3)"},
}

// exitStatusHelp is the table printed by --help.
func exitStatusHelp() string {
	var b strings.Builder
	b.WriteString("Exit status:")
	for _, s := range exitStatuses {
		fmt.Fprintf(&b, "\n  %d  %s", s.code, s.help)
	}
	return b.String()
}

// exitStatusTable is the README's exit-status table (Markdown).
func exitStatusTable() string {
	var b strings.Builder
	b.WriteString("| Status | Meaning |\n| --- | --- |")
	for _, s := range exitStatuses {
		fmt.Fprintf(&b, "\n| %d | %s |", s.code, s.readme)
	}
	return b.String()
}
