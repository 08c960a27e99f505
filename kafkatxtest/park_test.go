package kafkatxtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/kafkatxtest"
)

// With Config.Park the kit parks as the loop does: a message to be retried (a failure with
// attempts left, an Unavailable answer) parks its key, the key's later messages park behind
// it without running, other keys are committed; a database error does not park; without
// Park the same messages are retried and waited for.
func TestKitParksKeysAsTheLoopDoes(t *testing.T) {
	msgs := func() []*kafkatx.Message {
		m := func(off int64, key, value string) *kafkatx.Message {
			return kafkatxtest.NewMessage("orders", 0, off, []byte(key), []byte(value))
		}
		return []*kafkatx.Message{m(0, "k1", "a"), m(1, "k2", "fail-b"), m(2, "k1", "c"), m(3, "k2", "d"), m(4, "k3", "unavailable-e"), m(5, "k3", "f"), m(6, "k4", "g")}
	}
	for _, c := range []struct {
		park bool
		want string
	}{
		{true, "committed parked committed parked parked parked committed"},
		{false, "committed retried unavailable unavailable unavailable unavailable unavailable"}, // the batch after b waits on e
	} {
		k := setup(t, &kafkatx.Config{Park: kafkatx.ParkConfig{Enabled: c.park}})
		tx := k.Run(handler, msgs()...)
		if got := kinds(tx.Outcomes()); got != c.want {
			t.Fatalf("park %v: outcomes %q, want %q", c.park, got, c.want)
		}
		if !c.park {
			continue
		}
		var parked, attempts int
		if err := tx.QueryRow(context.Background(), `SELECT count(*), coalesce(sum(attempts), 0) FROM `+k.Schema()+`.key_parking`).Scan(&parked, &attempts); err != nil {
			t.Fatal(err)
		}
		if parked != 4 || attempts != 1 {
			t.Fatalf("%d parked rows with %d attempts in all, want 4 with 1 (fail-b's; Unavailable and parked-behind spend none)", parked, attempts)
		}
		if got := effects(t, tx); len(got) != 3 || got[0] != "a" || got[1] != "c" || got[2] != "g" {
			t.Fatalf("effects %v: want a, c, g (parked messages' effects rolled back or never run)", got)
		}
	}
	// A database error is shared trouble: it never parks.
	k := setup(t, &kafkatx.Config{Park: kafkatx.ParkConfig{Enabled: true}})
	tx := k.Run(func(ctx context.Context, _ pgx.Tx, m *kafkatx.Message) error {
		return errors.Join(errors.New("write"), &pgconn.PgError{Code: "42501", Message: "permission denied"})
	}, kafkatxtest.NewMessage("orders", 0, 0, []byte("k1"), []byte("x")))
	if got := kinds(tx.Outcomes()); got != "retried" {
		t.Fatalf("a database error: %q, want retried (not parked)", got)
	}
}
