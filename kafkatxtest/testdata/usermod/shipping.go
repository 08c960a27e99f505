// Package shipping turns paid orders into shipment requests: a kafkatx handler that writes one
// outbox record per order, so the request is published if and only if the order's offset is
// committed.
package shipping

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/outbox"
)

type order struct {
	ID      string `json:"id"`
	Address string `json:"address"`
	Weight  int    `json:"weight_grams"`
}

var carriers map[string]string // nil: the bug the tests find

// Handler returns the handler; schema holds kafkatx's tables (its outbox).
func Handler(schema string) kafkatx.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
		var o order
		if err := json.Unmarshal(m.Value, &o); err != nil {
			return kafkatx.Permanent(fmt.Errorf("order is not JSON: %w", err))
		}
		if o.Address == "" {
			return errors.New("address service has no address yet") // may come later: retry
		}
		if o.Weight > 30000 {
			carriers[o.ID] = "freight" // panics: assignment to entry in nil map
		}
		req, _ := json.Marshal(map[string]string{"order": o.ID, "to": o.Address})
		_, err := outbox.Writer{Schema: schema}.WriteTx(ctx, tx, outbox.Record{Topic: "shipment-requests", Key: []byte(o.ID), Value: req})
		return err
	}
}
