package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestDemoSplitsAndPrintsKubeProxyProbabilities(t *testing.T) {
	var out, errOut bytes.Buffer
	err := runMain(context.Background(), []string{"demo", "--endpoints", "3", "--connections", "3000", "--seed", "42"}, &out, &errOut)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, errOut.String())
	}
	text := out.String()
	for _, want := range []string{"0.3333333333", "0.5000000000", "(last rule)"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	// The connection counts of the three rows add up to 3000.
	rows := regexp.MustCompile(`(?m)^\s*10\.244\.\S+\s+\S+(?: rule\))?\s+\S+\s+(\d+)\s`).FindAllStringSubmatch(text, -1)
	if len(rows) != 3 {
		t.Fatalf("found %d endpoint rows, want 3:\n%s", len(rows), text)
	}
	sum := 0
	for _, r := range rows {
		n, _ := strconv.Atoi(r[1])
		sum += n
	}
	if sum != 3000 {
		t.Errorf("rows sum to %d connections, want 3000:\n%s", sum, text)
	}
}

func TestDemoAffinityPinsClients(t *testing.T) {
	var out, errOut bytes.Buffer
	err := runMain(context.Background(), []string{"demo", "--endpoints", "4", "--connections", "1000", "--clients", "10", "--affinity", "1h", "--seed", "7"}, &out, &errOut)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, errOut.String())
	}
	// Each of the 10 clients' first connection runs the lottery; the other
	// 990 are decided by affinity.
	if !strings.Contains(out.String(), "affinity decided 990 of 1000 connections") {
		t.Errorf("unexpected affinity count:\n%s", out.String())
	}
}

func TestBadArgumentsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--endpoints", "0"},
		{"demo", "--affinity", "25h"},
		{"demo", "--log-format", "xml"},
		{"nosuchcommand"},
		{},
	} {
		var out, errOut bytes.Buffer
		if err := runMain(context.Background(), args, &out, &errOut); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}
