// Package publish is the core both outbox relays are built on (package outbox/relay for
// table mode, package outbox/walrelay for WAL mode): what a broker's refusal of a record
// means (Classify), what a topic accepts (ReadLimits, Limits.Refuses), and the producer
// settings both share (ProducerDefaults). A rule about publishing an outbox record lives here
// once, so the same record gets the same outcome in either mode; each relay keeps only what
// its mode makes different (reading rows and marking them, or streaming a slot in Kafka
// transactions with a checkpoint).
package publish
