package kafkatx_test

import "testing"

// TestExampleTestAHandler runs the test of Example_testAHandler, so that the example's
// assertions hold (it needs DATABASE_URL).
func TestExampleTestAHandler(t *testing.T) {
	t.Parallel()
	testApplyPayment(t)
}
