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
