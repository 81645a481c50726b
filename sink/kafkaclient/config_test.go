package kafkaclient

import (
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		wantInErr string
	}{
		{"no brokers", Config{}, "Brokers: empty"},
		{"broker without port", Config{Brokers: []string{"kafka"}}, `"kafka"`},
		{"compression", Config{Brokers: []string{"k:9092"}, Compression: "brotli"}, "gzip"},
		{"sasl mechanism", Config{Brokers: []string{"k:9092"}, SASL: SASLConfig{Mechanism: "gssapi", Username: "u"}}, "scram-sha-512"},
		{"sasl without user", Config{Brokers: []string{"k:9092"}, SASL: SASLConfig{Mechanism: "plain"}}, "username"},
		{"cert without key", Config{Brokers: []string{"k:9092"}, TLS: TLSConfig{Enabled: true, CertFile: "c.pem"}}, "TLS.CertFile and TLS.KeyFile go together"},
		{"missing ca file", Config{Brokers: []string{"k:9092"}, TLS: TLSConfig{Enabled: true, CAFile: "/nonexistent/ca.pem"}}, "TLS.CAFile: cannot read it"},
		{"retry bounds", Config{Brokers: []string{"k:9092"}, RetryMin: time.Second, RetryMax: time.Millisecond}, "RetryMax: 1ms is below RetryMin 1s"},
		{"negative batch size", Config{Brokers: []string{"k:9092"}, BatchSize: -1}, "BatchSize: -1 is negative"},
		{"batch size too large", Config{Brokers: []string{"k:9092"}, BatchSize: 1_000_001}, "BatchSize: 1000001 is out of range; use a number of messages per produce call from 1 to 1000000"},
		{"negative batch bytes", Config{Brokers: []string{"k:9092"}, BatchBytes: -1}, "BatchBytes: -1 is negative"},
		{"batch bytes 1", Config{Brokers: []string{"k:9092"}, BatchBytes: 1}, "BatchBytes: 1 is out of range; use 65536 (64 KiB) to 2147483647 bytes"},
		{"batch bytes below 64 KiB", Config{Brokers: []string{"k:9092"}, BatchBytes: 64<<10 - 1}, "BatchBytes: 65535 is out of range"},
		{"batch bytes above int32", Config{Brokers: []string{"k:9092"}, BatchBytes: 1 << 31}, "BatchBytes: 2147483648 is out of range"},
		{"negative timeout", Config{Brokers: []string{"k:9092"}, WriteTimeout: -time.Second}, "negative"},
		{"negative topic wait", Config{Brokers: []string{"k:9092"}, TopicWait: -time.Second}, "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if err == nil {
				t.Fatalf("Validate(%+v) = nil; want an error containing %q", tt.cfg, tt.wantInErr)
			}
			if !strings.Contains(err.Error(), tt.wantInErr) {
				t.Errorf("Validate(%+v) = %q; want it to contain %q", tt.cfg, err, tt.wantInErr)
			}
		})
	}
	for _, cfg := range []Config{
		{Brokers: []string{"k:9092"}, BatchSize: 1, BatchBytes: 64 << 10},
		{Brokers: []string{"k:9092"}, BatchSize: 1_000_000, BatchBytes: 1<<31 - 1},
	} {
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate(batch size %d, batch bytes %d) = %v; want nil (the bounds are inclusive)", cfg.BatchSize, cfg.BatchBytes, err)
		}
	}
	for _, mech := range []string{"plain", "scram-sha-256", "SCRAM-SHA-512"} {
		cfg := Config{Brokers: []string{"k:9092"}, SASL: SASLConfig{Mechanism: mech, Username: "u", Password: "p"}, Compression: "zstd"}
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate(sasl %q) = %v; want nil", mech, err)
		}
	}
}
