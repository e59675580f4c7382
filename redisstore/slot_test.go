package redisstore

import "testing"

// TestKeySlot pins keySlot to Redis Cluster's own answers (CLUSTER KEYSLOT,
// as the Redis documentation shows them) and to the hash-tag rules of the
// cluster specification: the first '{' up to the next '}', when that text
// is not empty.
func TestKeySlot(t *testing.T) {
	tests := []struct {
		key  string
		want uint16
	}{
		{"123456789", 0x31C3 % 16384}, // the CRC16/XMODEM check value
		{"somekey", 11058},
		{"foo{hash_tag}", 2515},
		{"bar{hash_tag}", 2515},
		{"", 0},
	}
	for _, tt := range tests {
		if got := keySlot(tt.key); got != tt.want {
			t.Errorf("keySlot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}

	// Keys that must share a slot with their hash tag.
	same := []struct {
		key, as string
	}{
		{"{user1000}.following", "user1000"}, // a tag at the key's start
		{"x{user1000}", "user1000"},
		{"foo{bar}{zap}", "bar"},  // only the first tag counts
		{"foo{{bar}}zap", "{bar"}, // the first '{' to the next '}'
	}
	for _, tt := range same {
		if got, want := keySlot(tt.key), keySlot(tt.as); got != want {
			t.Errorf("keySlot(%q) = %d, want keySlot(%q) = %d", tt.key, got, tt.as, want)
		}
	}
	// An empty tag, or none closed, hashes the whole key.
	for _, key := range []string{"foo{}{bar}", "foo{bar"} {
		if got := keySlot(key); got == keySlot("") || got == keySlot("bar") {
			t.Errorf("keySlot(%q) = %d: the whole key must be hashed", key, got)
		}
	}
}
