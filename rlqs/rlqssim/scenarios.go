package rlqssim

import (
	"fmt"
	"time"

	"github.com/leapgate/leapgate/descriptors"
)

// Rules is the rule file the standard scenarios run against: one limit
// of 400 requests per second on the bucket {name: api}.
const Rules = `domain: rlqs-sim
descriptors:
  - key: name
    value: api
    rate_limit: {unit: second, requests_per_unit: 400}
`

// RuleSet returns Rules parsed, the rules every standard scenario runs
// against.
func RuleSet() (*descriptors.Set, error) {
	return descriptors.Parse([]descriptors.File{{Name: "rlqssim.yaml", Data: []byte(Rules)}}, descriptors.Options{})
}

// Scenarios returns the standard scenarios at the given report interval
// (5 s as stock Envoy reports, or 1 s), each 60 s long.
func Scenarios(report time.Duration) []Scenario {
	bucket := map[string]string{"name": "api"}
	client := func(name string, phases ...Phase) Client {
		return Client{Name: name, Bucket: bucket, Load: phases, Report: report}
	}
	base := Scenario{Domain: "rlqs-sim", Limit: 400, Window: time.Second, Duration: 60 * time.Second}
	named := func(name string, s Scenario) Scenario {
		s.Name = fmt.Sprintf("%s, %v reports", name, report)
		return s
	}
	sc := []Scenario{}
	s := base
	s.Clients = []Client{client("light-1", Phase{0, 20}), client("light-2", Phase{0, 20}), client("light-3", Phase{0, 20}), client("heavy", Phase{0, 1000})}
	sc = append(sc, named("no waste (20, 20, 20, 1000/s)", s))

	s = base
	s.Clients = []Client{client("a", Phase{0, 300}), client("b", Phase{0, 300}), client("c", Phase{20 * time.Second, 300})}
	sc = append(sc, named("join (300, 300, then 300/s at 20 s)", s))

	s = base
	b := client("b", Phase{0, 300})
	b.Leave = 20 * time.Second
	s.Clients = []Client{client("a", Phase{0, 300}), b, client("c", Phase{0, 300})}
	sc = append(sc, named("leave (300 × 3, one leaves at 20 s)", s))

	s = base
	s.Clients = []Client{client("a", Phase{0, 100}, Phase{20 * time.Second, 600}), client("b", Phase{0, 300}), client("c", Phase{0, 50}, Phase{40 * time.Second, 400})}
	sc = append(sc, named("demand changes (a 100→600 at 20 s, c 50→400 at 40 s)", s))

	s = base
	k := client("b", Phase{0, 300})
	k.Kill = 20 * time.Second
	k.Expiry = Behavior{Rate: 10}
	s.Clients = []Client{client("a", Phase{0, 300}), k}
	sc = append(sc, named("kill (b's connection drops at 20 s)", s))

	s = base
	s.Clients = []Client{client("a", Phase{0, 300}), client("b", Phase{0, 300}), client("c", Phase{0, 100})}
	for i := range s.Clients {
		s.Clients[i].Expiry = Behavior{Rate: 10}
	}
	s.Restarts = []time.Duration{30 * time.Second}
	sc = append(sc, named("server restart at 30 s", s))
	return sc
}
