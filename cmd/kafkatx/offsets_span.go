package main

import (
	"fmt"

	"github.com/kafkatx/kafkatx/internal/offsetstore"
)

// eventSpan renders an offset audit row's from/to for people: the half-open range
// "[from, to)", except for a log_adopted row, whose from is an offset of the old log and to
// one of the new (a move between two logs, not a range: "[50000, 0)" read as an empty or
// backwards range).
func eventSpan(kind string, from, to int64) string {
	if kind == offsetstore.KindLogAdopted {
		return fmt.Sprintf("%d of the old log -> %d of the new", from, to)
	}
	return fmt.Sprintf("[%d, %d)", from, to)
}
