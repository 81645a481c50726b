package main

import (
	"strings"
	"testing"
)

func TestCheckMultiHost(t *testing.T) {
	for _, tc := range []struct {
		dsn string
		ok  bool
	}{
		{"postgres://u@a:5432/db", true},
		{"postgres://u@a:5432,b:5432/db?target_session_attrs=read-write", true},
		{"host=a,b port=5432,5432 dbname=db target_session_attrs=primary", true},
		{"postgres://u@a:5432,b:5432/db", false},
		{"host=a,b port=5432,5432 dbname=db target_session_attrs=any", false},
		{"host=a,b dbname=db target_session_attrs=prefer-standby", false},
	} {
		err := checkMultiHost(tc.dsn)
		if (err == nil) != tc.ok {
			t.Errorf("checkMultiHost(%q) = %v; want ok %v", tc.dsn, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "target_session_attrs=read-write") {
			t.Errorf("checkMultiHost(%q) = %q; want it to name target_session_attrs=read-write", tc.dsn, err)
		}
	}
}
