package engine

// Split is the loop's one way of cutting a partition's run of messages into transactions, which
// the partition's lanes (executor.go) and the test kit kafkatxtest both run: a message that
// must run alone (it failed before, it was in flight when a process crashed, it is oversized)
// runs alone (One); the messages between two such run as one optimistic batch (Batch); a batch
// that fails naming message k records k's failure, so k must now run alone, and the next
// round commits the messages before k as a batch; a batch that fails naming none runs again
// one message per transaction, so the failure names its message.
type Split struct {
	// Alone reports whether message i must run alone in its own transaction.
	Alone func(i int) bool
	// Batch runs messages [i, j) in one transaction. failed is -1 when it committed,
	// Unattributed when it failed naming no message, else the index in [0, j-i) of the
	// message that failed — recorded by Batch, so that Alone(i+failed) now holds.
	Batch func(i, j int) (failed int, err error)
	// One runs message i alone.
	One func(i int) error
	// Before, when set, is called before each round with the index of its first message; an
	// error ends Run (a worker asked to stop: the rest is redelivered to the next owner).
	Before func(i int) error
}

// Run runs messages [0, n) and returns the first error of a callback.
func (s *Split) Run(n int) error {
	split := 0 // while > 0, the next split messages run one per transaction
	for i := 0; i < n; {
		if s.Before != nil {
			if err := s.Before(i); err != nil {
				return err
			}
		}
		if s.Alone(i) {
			if err := s.One(i); err != nil {
				return err
			}
			i, split = i+1, max(split-1, 0)
			continue
		}
		limit := n
		if split > 0 {
			limit = i + 1
		}
		j := i + 1
		for j < limit && !s.Alone(j) {
			j++
		}
		failed, err := s.Batch(i, j)
		switch {
		case err != nil:
			return err
		case failed == -1:
			i, split = j, max(split-(j-i), 0)
		case failed == Unattributed:
			split = j - i
		}
		// Otherwise message i+failed must now run alone: the next round commits the
		// messages before it as a batch, then runs it alone.
	}
	return nil
}
