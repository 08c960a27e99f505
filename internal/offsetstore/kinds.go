package offsetstore

import "strings"

// Audit event kinds: every kind an offset_audit row carries, listed once in Kinds below,
// which `kafkatx offsets audit --help` and the console read. Ranges are half-open: [From, To).
const (
	KindFirstRun        = "first_run"          // a partition seen for the first time; From = To = start
	KindOperatorSkip    = "operator_skip"      // a kafkatx command skipped [From, To)
	KindUnexplainedSkip = "unexplained_skip"   // Kafka was ahead with no command on record; [From, To) skipped
	KindKafkaBehind     = "kafka_behind"       // Kafka's committed offset From was behind the watermark To; re-committed
	KindKafkaMissing    = "kafka_missing"      // no committed offset in Kafka; the watermark To was re-committed
	KindReplay          = "replay"             // an operator rewound [From, To) to run again
	KindAlign           = "align"              // an operator aligned Kafka to the watermark
	KindHalt            = "halt"               // the consumer refused to start on the partition (Kafka ahead under the halt policy, or the watermark past the log end); nothing processed
	KindKafkaOutOfRange = "kafka_out_of_range" // Kafka's committed offset From was past the log end; ignored
	KindRollbackReplay  = "rollback_replayed"  // the database lost [From, To) (a failover, a restore): re-processed from From
	// KindLogAdopted is a watermark moved onto a new log (the topic recreated, or another
	// cluster) by `kafkatx offsets reset --mode adopt` or by Config.OnLogChange: From is the
	// watermark in the old log, To the start in the new one; the reason names the old and new
	// topic ids and cluster ids. The partition's history (offsets account) starts again at To.
	KindLogAdopted = "log_adopted"
	// KindUnexplainedMove is written by the watermarks trigger (migration 004) when the
	// watermark moved outside kafkatx: From is the old watermark, To the new one (To < From
	// for a rewind). A forward one is a gap in the accounting.
	KindUnexplainedMove = "unexplained_move"
	// KindWatermarkDeleted is written by the same trigger when a watermark row is deleted;
	// [From, To) is the deleted row's [first_offset, next_offset).
	KindWatermarkDeleted = "watermark_deleted"
	// KindAirflowRepair is `kafkatx airflow repair` re-creating in Airflow the runs or asset
	// events of [From, To) its ledger held and Airflow had lost; the watermark does not move.
	// The reason ends with the counts re-created.
	KindAirflowRepair = "airflow_repair"
	// KindParkedKeyReleased is an operator's `kafkatx parked-keys release`: the parked key's
	// head at From (To = From+1) made due now; the watermark does not move. The reason starts
	// with the key's hash ("key_hash <hex>: ").
	KindParkedKeyReleased = "parked_key_released"
	// KindParkedKeyDeadLettered is an operator's `kafkatx parked-keys dead-letter`: a parked
	// key's head, or all its parked messages, written to the dead-letter table and their
	// parked rows deleted in one transaction; [From, To) spans their offsets (below the
	// watermark: accounted for as parked, then as dead letters). The reason starts with the
	// key's hash and the offsets ("key_hash <hex>, offsets 3, 7: ").
	KindParkedKeyDeadLettered = "parked_key_dead_lettered"
	// KindAirflowClear is `kafkatx offsets reset --mode skip --clear-airflow` clearing in
	// Airflow what the skip's neighbourhood still had queued there: [From, To) covers the
	// offsets of the runs marked failed and of the asset events whose queue rows were deleted;
	// the reason names the operator_skip row and what was cleared.
	KindAirflowClear = "airflow_clear"
	// KindShardMove is `kafkatx shards move` (shards.Move) moving a partition's state to
	// another shard, written on both shards: on the shard it left, in the transaction that
	// deleted the state there (From = To = the watermark), and on the target, in the
	// transaction that wrote it. The reason names both shards and the directory's epoch.
	KindShardMove = "shard_move"
	// KindShardMoveCancel is `kafkatx shards move --cancel` (shards.CancelMove) cancelling a
	// move before its cut-over: written on the target, in the transaction that deleted the
	// copied state there, and on the shard the partition stays on (From = To = the
	// watermark, -1 when the partition had none). The reason names both shards and the
	// directory's new epoch.
	KindShardMoveCancel = "shard_move_cancel"
)

// Audit row statuses: pending for an operator command recorded but not yet applied, applied,
// or abandoned (recorded and never applied).
const (
	StatusPending   = "pending"
	StatusApplied   = "applied"
	StatusAbandoned = "abandoned"
)

// KindInfo describes one audit kind.
type KindInfo struct {
	Kind string
	// Attention, when not empty, says why an operator must not miss a row of this kind: the
	// console highlights the partition and counts it on its landing page.
	Attention string
}

// Kinds lists every audit kind, in the order `kafkatx offsets audit --help` names them.
var Kinds = []KindInfo{
	{Kind: KindFirstRun},
	{Kind: KindOperatorSkip},
	{Kind: KindUnexplainedSkip, Attention: "records skipped with no command on record (Kafka's committed offset moved outside kafkatx, or retention removed them)"},
	{Kind: KindKafkaBehind},
	{Kind: KindKafkaMissing},
	{Kind: KindReplay},
	{Kind: KindAlign},
	{Kind: KindHalt, Attention: "the consumer refused to start on the partition"},
	{Kind: KindKafkaOutOfRange},
	{Kind: KindRollbackReplay, Attention: "the database lost committed work (a failover to a standby that lagged, a restore) and the consumer re-processed the range"},
	{Kind: KindLogAdopted, Attention: "the watermark moved onto another log (the topic recreated, or another cluster)"},
	{Kind: KindUnexplainedMove, Attention: "the watermark was moved outside kafkatx"},
	{Kind: KindWatermarkDeleted, Attention: "a watermark row was deleted outside kafkatx"},
	{Kind: KindAirflowRepair},
	{Kind: KindParkedKeyReleased},
	{Kind: KindParkedKeyDeadLettered},
	{Kind: KindAirflowClear},
	{Kind: KindShardMove},
	{Kind: KindShardMoveCancel},
}

// StatusAttention says why an operator must not miss an audit row of status abandoned.
const StatusAttention = "an operator command was recorded and never applied"

// KindNames returns the kinds of Kinds joined with ", ", for help texts.
func KindNames() string {
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = k.Kind
	}
	return strings.Join(names, ", ")
}
