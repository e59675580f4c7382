package rlqs

import (
	"math"
	"testing"
)

func TestMaxMinShares(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name     string
		capacity float64
		demands  []float64
		want     []float64
	}{
		{"heavy takes what the light leave", 400, []float64{20, 20, 20, 1000}, []float64{20, 20, 20, 340}},
		{"all heavy split equally", 400, []float64{1000, 500, 300, 200}, []float64{100, 100, 100, 100}},
		{"spare handed out equally", 400, []float64{20, 20, 60}, []float64{120, 120, 160}},
		{"unknown demand claims the rest", 100, []float64{10, inf}, []float64{10, 90}},
		{"two unknowns split", 100, []float64{inf, inf}, []float64{50, 50}},
		{"middle level", 90, []float64{10, 50, 50}, []float64{10, 40, 40}},
		{"zero capacity", 0, []float64{5, 5}, []float64{0, 0}},
		{"negative capacity is zero", -3, []float64{5}, []float64{0}},
		{"negative demand is zero", 10, []float64{-1, inf}, []float64{0, 10}},
		{"none", 10, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make([]float64, len(tt.demands))
			maxMinShares(tt.capacity, tt.demands, got)
			sum := 0.0
			for i := range got {
				sum += got[i]
				if math.Abs(got[i]-tt.want[i]) > 1e-9 {
					t.Errorf("shares = %v, want %v", got, tt.want)
					break
				}
			}
			if sum > max(tt.capacity, 0)+1e-9 {
				t.Errorf("shares sum to %v, over the capacity %v", sum, tt.capacity)
			}
		})
	}
}
