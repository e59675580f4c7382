package rlqssim

import (
	"testing"
	"time"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/rlqs"
)

func TestScenarios(t *testing.T) {
	set, err := descriptors.Parse([]descriptors.File{{Name: "sim.yaml", Data: []byte(Rules)}}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, report := range []time.Duration{time.Second, 5 * time.Second} {
		for _, sc := range Scenarios(report) {
			tr, err := NewInProcess(set, rlqs.Options{})
			if err != nil {
				t.Fatal(err)
			}
			r := Run(sc, tr)
			t.Log(r)
		}
	}
}
