//go:build !linux

package bench

import "time"

func newTicker(interval time.Duration) ticker { return newSleepTicker(interval) }
