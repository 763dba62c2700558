package stats

import (
	"math"
	"testing"
)

// Reference values of the chi-square survival function, from standard tables
// (critical values at p = 0.05 and 0.001) and closed forms (df = 2: e^(-x/2)).
func TestSurvivalKnownValues(t *testing.T) {
	cases := []struct {
		x    float64
		df   int
		want float64
		tol  float64
	}{
		{3.841458820694124, 1, 0.05, 1e-9},
		{10.827566170662733, 1, 0.001, 1e-9},
		{5.991464547107979, 2, 0.05, 1e-9},
		{4, 2, math.Exp(-2), 1e-12},
		{40, 2, math.Exp(-20), 1e-18},
		{11.070497693516351, 5, 0.05, 1e-9},
		{124.34211340400407, 100, 0.05, 1e-8},
		{0, 3, 1, 0},
	}
	for _, c := range cases {
		got := Survival(c.x, c.df)
		if math.Abs(got-c.want) > c.tol {
			t.Errorf("Survival(%v, %d) = %v, want %v", c.x, c.df, got, c.want)
		}
	}
}

func TestGoodnessOfFit(t *testing.T) {
	fair, err := GoodnessOfFit([]int{5000, 5010, 4990}, Uniform(3))
	if err != nil {
		t.Fatal(err)
	}
	if fair.P < 0.5 {
		t.Errorf("near-uniform counts rejected: %v", fair)
	}
	skewed, err := GoodnessOfFit([]int{5300, 4850, 4850}, Uniform(3))
	if err != nil {
		t.Fatal(err)
	}
	if skewed.P > 0.001 {
		t.Errorf("skewed counts accepted: %v", skewed)
	}
	if _, err := GoodnessOfFit([]int{1, 2}, []float64{1, 0}); err == nil {
		t.Error("zero expected probability accepted")
	}
}

func TestTwoSample(t *testing.T) {
	same, err := TwoSample([]int{1000, 2000, 3000}, []int{1010, 1990, 3005})
	if err != nil {
		t.Fatal(err)
	}
	if same.P < 0.5 {
		t.Errorf("same distributions told apart: %v", same)
	}
	diff, err := TwoSample([]int{1000, 2000, 3000}, []int{2000, 2000, 2000})
	if err != nil {
		t.Fatal(err)
	}
	if diff.P > 1e-6 {
		t.Errorf("different distributions not told apart: %v", diff)
	}
}
