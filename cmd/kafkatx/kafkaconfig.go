package main

import (
	"fmt"
	"maps"
	"os"
	"strings"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kafkatx/kafkatx/cmd/kafkaprops"
)

// kafkaConfig builds the librdkafka settings every subcommand uses: bootstrap servers and
// client.id, then kafkaSettings over them. Values are never printed.
func (g *Globals) kafkaConfig(clientID string) (kafka.ConfigMap, error) {
	brokers, err := g.requireBrokers()
	if err != nil {
		return nil, err
	}
	settings, err := g.kafkaSettings()
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	cfg := kafka.ConfigMap{"bootstrap.servers": brokers, "client.id": clientID}
	for k, v := range settings { // the file and -X may set these two as well
		cfg[k] = v
	}
	return cfg, nil
}

// checkKafkaSettings has librdkafka check the settings the flags give (kafkaprops.Check), at
// parse time: a property it does not know, a value it refuses, an unreadable file or a bad
// line is a usage error before anything connects (it was exit status 1 from the first
// client); a refused setting of the file is named with the file's path. Nothing to check when
// no Kafka setting is given.
func (g *Globals) checkKafkaSettings() error {
	if g.KafkaConfigFile == "" && len(g.KafkaConfig) == 0 && g.SecurityProtocol == "" && g.SASLMechanism == "" &&
		g.SASLUsername == "" && g.SASLPasswordFile == "" {
		return nil
	}
	file, err := g.fileSettings()
	if err != nil {
		return err
	}
	// The file's own settings first, so a refusal of one of them names the file.
	if g.KafkaConfigFile != "" {
		if err := kafkaprops.Check(file); err != nil {
			return fmt.Errorf("--kafka-config-file %s: %w", g.KafkaConfigFile, err)
		}
	}
	cfg, err := g.flagSettingsOver(maps.Clone(file))
	if err != nil {
		return err
	}
	return kafkaprops.Check(cfg)
}

// kafkaSettings is the properties file, then -X properties, then the security flags.
func (g *Globals) kafkaSettings() (kafka.ConfigMap, error) {
	cfg, err := g.fileSettings()
	if err != nil {
		return nil, err
	}
	return g.flagSettingsOver(cfg)
}

// fileSettings is --kafka-config-file's properties (none without the flag).
func (g *Globals) fileSettings() (kafka.ConfigMap, error) {
	cfg := kafka.ConfigMap{}
	if g.KafkaConfigFile != "" {
		if err := kafkaprops.Read(g.KafkaConfigFile, cfg); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// flagSettingsOver sets, in cfg, the -X properties, then the security flags, and returns it.
func (g *Globals) flagSettingsOver(cfg kafka.ConfigMap) (kafka.ConfigMap, error) {
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
