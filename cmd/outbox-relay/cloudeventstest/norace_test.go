//go:build !race

package cloudeventstest

const raceEnabled = false
