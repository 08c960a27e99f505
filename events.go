package kafkatx

// The one place where the loop records what happened: each event moves its Stats counter and
// its Prometheus metric together, so the two never disagree. A new event, or a new metric for
// an old one, is a change to this file.

// countProcessed records n messages of topic whose handler effects committed.
func (c *Consumer) countProcessed(topic string, n int) {
	if n <= 0 {
		return
	}
	c.stats.processed.Add(int64(n))
	c.metrics.processed.WithLabelValues(c.group, topic).Add(float64(n))
}

// countDuplicates records n messages of topic dropped without running the handler: below the
// watermark (a redelivery) or carrying a business key already claimed.
func (c *Consumer) countDuplicates(topic string, n int) {
	if n <= 0 {
		return
	}
	c.stats.duplicates.Add(int64(n))
	c.metrics.duplicates.WithLabelValues(c.group, topic).Add(float64(n))
}

// countNotChanges records n records of topic that the key function answered
// idempotency.ErrNotAChange for: committed past without running the handler.
func (c *Consumer) countNotChanges(topic string, n int) {
	if n <= 0 {
		return
	}
	c.stats.notChanges.Add(int64(n))
	c.metrics.notChanges.WithLabelValues(c.group, topic).Add(float64(n))
}

// countRetry records a try of a message after its first.
func (c *Consumer) countRetry(topic string) {
	c.stats.retries.Add(1)
	c.metrics.retries.WithLabelValues(c.group, topic).Inc()
}

// countDeadLetter records a message of topic dead-lettered with the given error class.
func (c *Consumer) countDeadLetter(topic, class string) {
	c.stats.deadLettered.Add(1)
	c.metrics.deadLetters.WithLabelValues(c.group, topic, class).Inc()
}

// countSkipped records n offsets of topic skipped with an audit row of the given kind
// (offsetstore.KindOperatorSkip or KindUnexplainedSkip).
func (c *Consumer) countSkipped(topic, kind string, n int64) {
	if n <= 0 {
		return
	}
	c.stats.skipped.Add(n)
	c.metrics.skipped.WithLabelValues(c.group, topic, kind).Add(float64(n))
}

// countUnavailable records a try of a message of topic whose handler answered Unavailable.
func (c *Consumer) countUnavailable(topic string) {
	c.stats.unavailable.Add(1)
	c.metrics.unavailable.WithLabelValues(c.group, topic).Inc()
}

// countPause records a partition that stopped fetching over its MaxBufferedBytes share.
func (c *Consumer) countPause() { c.stats.pauses.Add(1) }
