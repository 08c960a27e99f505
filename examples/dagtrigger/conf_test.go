package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/kafkatx/kafkatx/idempotency"
)

// TestConfFromRealEvents: a run's conf, built from events a real Debezium 3.6.1 connector
// wrote (idempotency/testdata/debezium-3.6.1), carries no placeholder as data.
func TestConfFromRealEvents(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../../idempotency/testdata/debezium-3.6.1/stream.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := map[string][]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r struct {
			Topic      string
			Key, Value json.RawMessage
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		ev, err := idempotency.ParseDebezium(r.Value)
		if err != nil {
			continue // not a change
		}
		for _, full := range []bool{false, true} {
			c, err := conf(ev, r.Key, full)
			if err != nil {
				t.Fatalf("%s: %v", r.Value, err)
			}
			if strings.Contains(string(c), idempotency.UnavailableValue) {
				t.Errorf("conf %s carries the TOAST placeholder", c)
			}
			tag := ev.Op
			if full {
				tag += "/full"
			}
			got[tag] = append(got[tag], string(c))
		}
	}
	has := func(tag, want string) {
		t.Helper()
		for _, c := range got[tag] {
			if c == want {
				return
			}
		}
		t.Errorf("no %s conf %s among %q", tag, want, got[tag])
	}
	has("u", `{"id":50,"name":"toast","note":null,"qty":9}`) // body: unchanged TOAST, left out
	has("d", `{"before":{"id":10},"op":"d"}`)                // default replica identity: the key only
	has("d/full", `{"before":{"id":10,"name":"","qty":0,"note":null,"body":null},"op":"d"}`)
	has("d", `{"before":{"a":2,"b":"upd"},"op":"d"}`) // keyless (REPLICA IDENTITY FULL): the whole row
	has("t", `{"op":"t","table":"public.kl"}`)
	has("m", `{"message":{"prefix":"pfx","content":"aGVsbG8="},"op":"m"}`)
	has("r", `{"id":1,"name":"snap1","qty":1,"note":null,"body":null}`)
}

func TestParseOps(t *testing.T) {
	t.Parallel()
	if ops, err := parseOps("c,u,d,r"); err != nil || len(ops) != 4 || ops["t"] || ops["m"] {
		t.Errorf("default: %v %v", ops, err)
	}
	if ops, err := parseOps(" c, t ,m"); err != nil || !ops["t"] || !ops["m"] || ops["u"] {
		t.Errorf("c,t,m: %v %v", ops, err)
	}
	for _, bad := range []string{"", ",", "c,x", "create"} {
		if _, err := parseOps(bad); err == nil {
			t.Errorf("parseOps(%q) accepted", bad)
		}
	}
}
