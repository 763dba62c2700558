// Package stats holds the statistical tests the test suites share: Pearson's
// chi-square goodness of fit and the two-sample homogeneity test, with exact
// p-values from the regularized incomplete gamma function.
//
// Callers: tests of balancer, proxy and integration. It is pure and imports
// only the standard library.
package stats
