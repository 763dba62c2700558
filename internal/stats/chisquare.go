package stats

import (
	"errors"
	"fmt"
	"math"
)

// ChiSquareResult is the outcome of a chi-square test.
type ChiSquareResult struct {
	Statistic float64
	DF        int
	P         float64 // probability of a statistic at least this large under the null hypothesis
}

func (r ChiSquareResult) String() string {
	return fmt.Sprintf("chi2=%.3f df=%d p=%.4g", r.Statistic, r.DF, r.P)
}

// GoodnessOfFit tests observed counts against expected probabilities (which
// must sum to 1). Every expected count must be positive.
func GoodnessOfFit(observed []int, probs []float64) (ChiSquareResult, error) {
	if len(observed) != len(probs) || len(observed) < 2 {
		return ChiSquareResult{}, errors.New("stats: need at least two categories and one probability per category")
	}
	total := 0
	for _, o := range observed {
		total += o
	}
	var chi float64
	for i, o := range observed {
		e := probs[i] * float64(total)
		if e <= 0 {
			return ChiSquareResult{}, fmt.Errorf("stats: expected count of category %d is %v", i, e)
		}
		d := float64(o) - e
		chi += d * d / e
	}
	df := len(observed) - 1
	return ChiSquareResult{Statistic: chi, DF: df, P: Survival(chi, df)}, nil
}

// Uniform returns n equal probabilities.
func Uniform(n int) []float64 {
	p := make([]float64, n)
	for i := range p {
		p[i] = 1 / float64(n)
	}
	return p
}

// TwoSample tests whether two samples of counts over the same categories come
// from the same distribution (chi-square test of homogeneity on a 2 x k
// table). Categories empty in both samples are dropped.
func TwoSample(a, b []int) (ChiSquareResult, error) {
	if len(a) != len(b) {
		return ChiSquareResult{}, errors.New("stats: samples have different numbers of categories")
	}
	var na, nb float64
	for i := range a {
		na += float64(a[i])
		nb += float64(b[i])
	}
	if na == 0 || nb == 0 {
		return ChiSquareResult{}, errors.New("stats: an empty sample")
	}
	var chi float64
	k := 0
	for i := range a {
		col := float64(a[i] + b[i])
		if col == 0 {
			continue
		}
		k++
		ea := col * na / (na + nb)
		eb := col * nb / (na + nb)
		da, db := float64(a[i])-ea, float64(b[i])-eb
		chi += da*da/ea + db*db/eb
	}
	if k < 2 {
		return ChiSquareResult{}, errors.New("stats: fewer than two non-empty categories")
	}
	return ChiSquareResult{Statistic: chi, DF: k - 1, P: Survival(chi, k-1)}, nil
}

// Survival returns P(X >= x) for X chi-square distributed with df degrees of
// freedom: the regularized upper incomplete gamma function Q(df/2, x/2).
func Survival(x float64, df int) float64 {
	if x <= 0 {
		return 1
	}
	return upperGammaQ(float64(df)/2, x/2)
}

// upperGammaQ computes Q(a, x) = Γ(a, x)/Γ(a): by its power series for P when
// x < a+1, by a continued fraction (modified Lentz) otherwise.
func upperGammaQ(a, x float64) float64 {
	lg, _ := math.Lgamma(a)
	prefix := math.Exp(-x + a*math.Log(x) - lg)
	if x < a+1 {
		// P(a,x) = x^a e^-x / Γ(a+1) * Σ x^n / ((a+1)...(a+n))
		term := 1 / a
		sum := term
		for n := 1; n < 10000; n++ {
			term *= x / (a + float64(n))
			sum += term
			if math.Abs(term) < math.Abs(sum)*1e-15 {
				break
			}
		}
		return 1 - sum*prefix
	}
	// Continued fraction for Q: 1/(x+1-a- 1*(1-a)/(x+3-a- 2*(2-a)/(x+5-a- ...)))
	const tiny = 1e-300
	b := x + 1 - a
	c := 1 / tiny
	d := 1 / b
	h := d
	for i := 1; i < 10000; i++ {
		an := -float64(i) * (float64(i) - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = b + an/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		delta := d * c
		h *= delta
		if math.Abs(delta-1) < 1e-15 {
			break
		}
	}
	return h * prefix
}
