package relay

import (
	"fmt"
	"sync"
	"time"

	"github.com/kafkatx/kafkatx/pg"
)

// unmarkableFor is how long Ready names a row whose mark PostgreSQL refused after the last
// refusal: a row still there is refused again by every round that reaches it, sooner.
const unmarkableFor = time.Minute

// unmarkable remembers the rows a mark row by row (markByRow) could not mark, for Ready. A
// row is forgotten once a later mark marks it, or unmarkableFor after its last refusal (the
// row was deleted or released meanwhile). Safe from any goroutine.
type unmarkable struct {
	mu   sync.Mutex
	rows map[int64]unmarkableRow
}

type unmarkableRow struct {
	topic, what, err string
	at               time.Time
}

func (u *unmarkable) add(w *row, what string, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.rows == nil {
		u.rows = map[int64]unmarkableRow{}
	}
	u.rows[w.id] = unmarkableRow{topic: w.topic, what: what, err: pg.SanitizeText(err.Error(), 512), at: time.Now()}
}

// forget drops the rows of a mark that marked them (results with an outcome other than
// outcomeNone).
func (u *unmarkable) forget(rows []row, results []result) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.rows) == 0 {
		return
	}
	for i, res := range results {
		if res.outcome != outcomeNone {
			delete(u.rows, rows[i].id)
		}
	}
}

// notReady names the lowest unmarkable row refused within unmarkableFor, and how many
// others there are; "" when none.
func (u *unmarkable) notReady() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var first int64
	n := 0
	for id, w := range u.rows {
		if time.Since(w.at) > unmarkableFor {
			delete(u.rows, id)
			continue
		}
		if n == 0 || id < first {
			first = id
		}
		n++
	}
	if n == 0 {
		return ""
	}
	w := u.rows[first]
	msg := fmt.Sprintf("outbox row %d (topic %s) could not be %s: %s", first, pg.SanitizeText(w.topic, 300), w.what, w.err)
	if n > 1 {
		msg += fmt.Sprintf(" (and %d other rows)", n-1)
	}
	return msg
}
