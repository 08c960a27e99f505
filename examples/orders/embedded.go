package main

import (
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx/kafkatxtest/kafkatxbroker"
)

// startEmbedded starts the in-process broker of the zero-setup demo.
func startEmbedded(log *zap.Logger) (brokers string, closeFn func(), err error) {
	b, err := kafkatxbroker.Start(&kafkatxbroker.Options{Logger: log})
	if err != nil {
		return "", nil, err
	}
	return b.Bootstrap(), b.Close, nil
}
