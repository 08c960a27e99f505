package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/kafkaprops"
)

// kafkaConfig builds the librdkafka settings every subcommand uses: bootstrap servers and
// client.id, then the properties file, then -X properties, then the security flags. Values
// are never printed.
func (g *Globals) kafkaConfig(clientID string) (kafka.ConfigMap, error) {
	brokers, err := g.requireBrokers()
	if err != nil {
		return nil, err
	}
	cfg := kafka.ConfigMap{"bootstrap.servers": brokers, "client.id": clientID}
	if g.KafkaConfigFile != "" {
		if err := kafkaprops.Read(g.KafkaConfigFile, cfg); err != nil {
			return nil, err
		}
	}
	for _, kv := range g.KafkaConfig {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("--kafka-config %q: want key=value", strings.SplitN(kv, "=", 2)[0])
		}
		cfg[strings.TrimSpace(k)] = v
	}
	set := func(k, v string) {
		if v != "" {
			cfg[k] = v
		}
	}
	set("security.protocol", g.SecurityProtocol)
	set("sasl.mechanism", g.SASLMechanism)
	set("sasl.username", g.SASLUsername)
	if g.SASLPasswordFile != "" {
		pw, err := readSecretFile(g.SASLPasswordFile)
		if err != nil {
			return nil, err
		}
		cfg["sasl.password"] = pw
	}
	return cfg, nil
}

// readSecretFile returns the file's content without its trailing newline.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("secret file: %w", err) // the path, never the content
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}
