package walrelay

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// watchHeap samples the Go heap in use every 10 ms until the test ends and returns a function
// reporting the peak so far.
func watchHeap(t *testing.T) func() uint64 {
	var peak atomic.Uint64
	stop := make(chan struct{})
	go func() {
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
		}
	}()
	t.Cleanup(func() { close(stop) })
	return peak.Load
}
