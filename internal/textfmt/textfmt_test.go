package textfmt

import "testing"

func TestOneLine(t *testing.T) {
	for in, want := range map[string]string{
		"a\nb":                   "a b",
		"  yaml: line 3:\n\t x ": "yaml: line 3: x",
		"":                       "",
	} {
		if got := OneLine(in); got != want {
			t.Errorf("OneLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBytes(t *testing.T) {
	for in, want := range map[int64]string{
		0:          "0 B",
		1023:       "1023 B",
		1024:       "1.0 KiB",
		1536 << 20: "1.5 GiB",
		8 << 30:    "8.0 GiB",
		3 << 50:    "3.0 PiB",
	} {
		if got := Bytes(in); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", in, got, want)
		}
	}
	if got := BytesCompact(1536 << 20); got != "1.5GiB" {
		t.Errorf("BytesCompact = %q", got)
	}
}

func TestJoin(t *testing.T) {
	type reason string
	if got := Join([]reason{"version", "encryption"}, ", "); got != "version, encryption" {
		t.Errorf("Join = %q", got)
	}
	if got := Join([]reason(nil), ","); got != "" {
		t.Errorf("Join(nil) = %q", got)
	}
}
