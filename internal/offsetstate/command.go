package offsetstate

import (
	"fmt"

	"github.com/kafkatx/kafkatx/pg"
)

// ResetCommand is the start of every `kafkatx offsets reset` a hint or an error prints for an
// operator to run: --schema (the tables' schema, pg.SchemaOr: without it the command
// acts on the default schema, not the consumer's), --group, --topic and, when partition >= 0,
// --partition, each value made one shell word by quote.
func ResetCommand(schema, group, topic string, partition int32, quote func(string) string) string {
	cmd := fmt.Sprintf("kafkatx offsets reset --schema %s --group %s --topic %s", quote(pg.SchemaOr(schema)), quote(group), quote(topic))
	if partition >= 0 {
		cmd += fmt.Sprintf(" --partition %d", partition)
	}
	return cmd
}

// ResetStep is a whole `kafkatx offsets reset` a message prints as a step to run:
// ResetCommand, then target (one of --to-offset N, --to-time T, --to-earliest, --to-latest,
// --to-database), --mode mode when mode is not empty, and "--reason TEXT --execute" (--reason
// is required: TEXT is the placeholder the operator fills in).
func ResetStep(schema, group, topic string, partition int32, target, mode string, quote func(string) string) string {
	cmd := ResetCommand(schema, group, topic, partition, quote) + " " + target
	if mode != "" {
		cmd += " --mode " + mode
	}
	return cmd + " --reason TEXT --execute"
}
