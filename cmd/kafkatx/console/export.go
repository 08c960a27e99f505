package console

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// maxExportRows bounds one export (GET /api/dead-letters/export): the first 100,000 dead
// letters of the filters, read 1,000 at a time by id (keyset paging); X-Kafkatx-Truncated
// says when more matched.
const maxExportRows = 100_000

// exportColumns are the CSV columns, in the JSON fields' names.
var exportColumns = []string{"id", "status", "group", "topic", "partition", "offset", "timestamp", "key", "value", "error_class",
	"error_message", "attempts", "first_failure", "last_failure", "replay_epoch", "created_at", "resolved_at", "fingerprint", "replays", "refailed",
	"topic_id", "cluster_id"}

func csvRow(it DeadLetterItem) []string {
	ts, resolved := "", ""
	if it.Timestamp != nil {
		ts = it.Timestamp.UTC().Format(time.RFC3339Nano)
	}
	if it.ResolvedAt != nil {
		resolved = it.ResolvedAt.UTC().Format(time.RFC3339Nano)
	}
	return []string{strconv.FormatInt(it.ID, 10), it.Status, it.Group, it.Topic, strconv.Itoa(int(it.Partition)), strconv.FormatInt(it.Offset, 10),
		ts, it.Key, it.Value, it.ErrorClass, it.ErrorMessage, strconv.Itoa(it.Attempts), it.FirstFailure.UTC().Format(time.RFC3339Nano),
		it.LastFailure.UTC().Format(time.RFC3339Nano), strconv.Itoa(it.ReplayEpoch), it.CreatedAt.UTC().Format(time.RFC3339Nano), resolved,
		it.Fingerprint, strconv.Itoa(it.Replays), strconv.FormatBool(it.Refailed), it.TopicID, it.ClusterID}
}

// apiDeadLettersExport answers GET /api/dead-letters/export?filters&format=json|csv: the
// dead letters of the filters (as GET /api/dead-letters, keys and values summarized), oldest
// first, as one JSON array or a CSV file with a header row, as an attachment. Every chunk
// passes through the secret mask like every other answer.
func (h *Handler) apiDeadLettersExport(w http.ResponseWriter, r *http.Request) {
	format := r.URL.Query().Get("format")
	if format != "json" && format != "csv" {
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("format %q: want json or csv", format))
		return
	}
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	f.Query.Limit = maxListLimit
	// The first page before any byte is written: an error is still an error status.
	items, err := h.search(r, f)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	name := "dead-letters-" + time.Now().UTC().Format("20060102T150405Z") + "." + format
	if format == "csv" {
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`"`)
	w.WriteHeader(http.StatusOK)
	var buf strings.Builder
	cw := csv.NewWriter(&buf)
	flush := func() {
		if format == "csv" {
			cw.Flush()
		}
		_, _ = w.Write([]byte(h.redact(buf.String())))
		buf.Reset()
	}
	if format == "csv" {
		_ = cw.Write(exportColumns)
	} else {
		buf.WriteString("[")
	}
	n := 0
	for {
		for _, it := range items {
			if format == "csv" {
				_ = cw.Write(csvRow(it))
			} else {
				if n > 0 {
					buf.WriteString(",\n")
				}
				b, _ := json.Marshal(it)
				buf.Write(b)
			}
			n++
		}
		flush()
		if len(items) < f.Query.Limit || n >= maxExportRows {
			break
		}
		f.Query.AfterID = items[len(items)-1].ID
		if items, err = h.search(r, f); err != nil {
			h.log.Error("console: export stopped", zap.String("error", h.redact(err.Error())))
			break // the file ends short; the status is sent already
		}
	}
	if format == "json" {
		buf.WriteString("]\n")
		flush()
	}
}
