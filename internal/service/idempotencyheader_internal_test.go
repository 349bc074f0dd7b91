package service

import "testing"

func TestHeaderKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		values      []string
		key         string
		present, ok bool
	}{
		{"absent", nil, "", false, true},
		{"plain", []string{"order-1234"}, "order-1234", true, true},
		{"plain with spaces and unicode", []string{"order 1234 ü"}, "order 1234 ü", true, true},
		{"structured field string", []string{`"order-1234"`}, "order-1234", true, true},
		{"escapes", []string{`"a\"b\\c"`}, `a"b\c`, true, true},
		{"a lone quote is a key", []string{`"`}, `"`, true, true},
		{"empty", []string{""}, "", true, false},
		{"empty quoted", []string{`""`}, "", true, false},
		{"bad escape", []string{`"a\b"`}, "", true, false},
		{"unescaped quote inside", []string{`"a"b"`}, "", true, false},
		{"non-ASCII inside quotes", []string{`"ü"`}, "", true, false},
		{"tab", []string{"a\tb"}, "", true, false},
		{"DEL", []string{"a\x7fb"}, "", true, false},
		{"two", []string{"a", "a"}, "", true, false},
		{"invalid UTF-8", []string{"k-\xff"}, "", true, false},
		{"invalid UTF-8, another byte", []string{"k-\xfe"}, "", true, false},
		{"a lone continuation byte", []string{"\x80"}, "", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, present, err := headerKey(tt.values)
			if key != tt.key || present != tt.present || (err == nil) != tt.ok {
				t.Errorf("headerKey(%q) = %q, %v, %v; want %q, %v, ok %v", tt.values, key, present, err, tt.key, tt.present, tt.ok)
			}
		})
	}
}
