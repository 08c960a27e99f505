package engine

import "github.com/kafkatx/kafkatx/internal/offsetstore"

// ParkedCount is one assigned partition's parked keys and parked messages (Settings.ParkKeys),
// as its worker counts them in memory (parkedKeys: loaded at assignment and after a fence,
// kept with every parking and take; messages being parked included).
type ParkedCount struct {
	TP             offsetstore.TP
	Keys, Messages int
}

// counts returns the number of parked keys and messages (0, 0 for a nil k).
func (k *parkedKeys) counts() (keys, messages int) {
	if k == nil {
		return 0, 0
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.n), k.total
}

// Parked returns the parked counts of every assigned partition when parking is on (zeros
// included; nil when it is off): what the consumer's kafkatx_parked_keys and
// kafkatx_parked_messages gauges show at a scrape. It reads memory only, never the database.
// Safe from any goroutine.
func (l *Loop) Parked() []ParkedCount {
	if !l.set.ParkKeys {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]ParkedCount, 0, len(l.parts))
	for tp, f := range l.parts {
		keys, msgs := f.w.parked.counts()
		out = append(out, ParkedCount{TP: tp, Keys: keys, Messages: msgs})
	}
	return out
}
