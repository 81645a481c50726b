package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

const day = 24 * time.Hour

// durationForm is the accepted spelling of a duration, for messages.
const durationForm = "write it like 10s, 250ms, 1m30s, 12h or 7d"

// parseDuration reads a duration as the config file and flags take it: Go's
// form (10s, 1m30s, 12h) with an optional leading number of days (7d,
// 1.5d, 2d12h), since retention periods are spoken of in days and 168h reads
// badly. A day is 24 hours: no calendar or daylight-saving arithmetic.
func parseDuration(s string) (time.Duration, error) {
	num, rest, ok := strings.Cut(s, "d")
	if !ok {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration; %s", s, durationForm)
		}
		return d, nil
	}
	sign := 1.0
	if n, cut := strings.CutPrefix(num, "-"); cut {
		sign, num = -1, n
	}
	days, err := strconv.ParseFloat(num, 64)
	// ParseFloat takes forms no operator means as days: signs, exponents,
	// hex, Inf, NaN. Digits and one dot only.
	if err != nil || num == "" || strings.Trim(num, "0123456789.") != "" {
		return 0, fmt.Errorf("%q is not a duration; %s", s, durationForm)
	}
	var extra time.Duration
	if rest != "" {
		if strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "+") {
			return 0, fmt.Errorf("%q is not a duration; %s", s, durationForm)
		}
		if extra, err = time.ParseDuration(rest); err != nil {
			return 0, fmt.Errorf("%q is not a duration; %s", s, durationForm)
		}
	}
	total := days*float64(day) + float64(extra)
	if total >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is out of range: at most about 106751d", s)
	}
	return time.Duration(sign * total), nil
}
