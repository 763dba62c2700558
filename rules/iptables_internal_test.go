package rules

import "testing"

// TestSavedProbability: the values iptables-save v1.8.9 printed back for
// rules restored with kube-proxy's probabilities.
func TestSavedProbability(t *testing.T) {
	for k, want := range map[int]string{
		2:      "0.50000000000",
		3:      "0.33333333349",
		100001: "0.00001000008", // kube-proxy writes 0.0000099999
	} {
		if got := savedProbability(k); got != want {
			t.Errorf("savedProbability(%d) = %s, want %s", k, got, want)
		}
	}
}

// TestSaveString follows libxtables' xtables_save_string.
func TestSaveString(t *testing.T) {
	for in, want := range map[string]string{
		"KUBE-SEP-SXIVWICOYRO3J4NJ": "KUBE-SEP-SXIVWICOYRO3J4NJ",
		"ns_1-x":                    "ns_1-x",
		"ns1/svc1:p80":              `"ns1/svc1:p80"`,
		"a b":                       `"a b"`,
		`say "hi" it's \ here`:      `"say \"hi\" it\'s \\ here"`,
		"":                          `""`,
	} {
		if got := saveString(in); got != want {
			t.Errorf("saveString(%q) = %s, want %s", in, got, want)
		}
	}
}
