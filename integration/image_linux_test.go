//go:build linux

package integration

import (
	"debug/buildinfo"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestImage builds the container image as README says (`make image`, with
// buildah on vfs storage of its own) and checks what the Containerfile
// promises: one static, trimmed, version-stamped binary FROM scratch, run as
// 65532 with the file capability cap_net_admin=ep; `userproxy version` runs
// in it when NET_ADMIN is granted and cannot start when it is not.
func TestImage(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("buildah"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must build the image: %v (apt-get install buildah)", err)
		}
		t.Skip("needs buildah (apt-get install buildah)")
	}
	dir := t.TempDir()
	buildah := []string{"buildah", "--storage-driver", "vfs",
		"--root", filepath.Join(dir, "storage"), "--runroot", filepath.Join(dir, "run")}
	const image = "localhost/userproxy:test"
	run := func(args ...string) (string, error) {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		return string(out), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}

	// 1. make image, as a user runs it, into this test's storage.
	start := time.Now()
	mk := exec.Command("make", "--no-print-directory", "image", "IMAGE="+image,
		"BUILDAH="+strings.Join(buildah, " "), "IMAGE_CONTEXT="+filepath.Join(dir, "context"))
	mk.Dir = ".."
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Logf("make image: %v", time.Since(start).Round(time.Millisecond))

	// 2. The image's configuration.
	var inspect struct {
		OCIv1 struct {
			Config struct {
				User       string
				Entrypoint []string
				Cmd        []string
				Labels     map[string]string
			} `json:"config"`
		}
	}
	if err := json.Unmarshal([]byte(must(append(buildah, "inspect", "--type", "image", image)...)), &inspect); err != nil {
		t.Fatalf("buildah inspect: %v", err)
	}
	cfg := inspect.OCIv1.Config
	if cfg.User != "65532:65532" {
		t.Errorf("image user %q, want 65532:65532", cfg.User)
	}
	if !slices.Equal(cfg.Entrypoint, []string{"/userproxy"}) || len(cfg.Cmd) != 0 {
		t.Errorf("entrypoint %q, cmd %q; want [/userproxy] and none", cfg.Entrypoint, cfg.Cmd)
	}
	version := cfg.Labels["org.opencontainers.image.version"]
	if version == "" || version == "dev" {
		t.Errorf("version label %q: want the stamped version", version)
	}

	ctr := strings.TrimSpace(must(append(buildah, "from", image)...))
	t.Cleanup(func() { _, _ = run(append(buildah, "rm", ctr)...) })

	// 3. The root file system, before anything ran in it: the binary alone.
	root := strings.TrimSpace(must(append(buildah, "mount", ctr)...))
	t.Cleanup(func() { _, _ = run(append(buildah, "umount", ctr)...) })
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		files = append(files, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(files, []string{"userproxy", "usr", "usr/local", "usr/local/bin", "usr/local/bin/kube-proxy"}) {
		t.Errorf("image holds %q, want only userproxy and its link /usr/local/bin/kube-proxy (no shell, nothing else)", files)
	}
	bin := filepath.Join(root, "userproxy")
	checkFileCaps(t, bin)
	checkStaticBuild(t, bin)
	// kube-proxy's DaemonSet runs /usr/local/bin/kube-proxy: the same
	// file, not a second copy.
	var a, b unix.Stat_t
	if err := unix.Stat(bin, &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(root, "usr/local/bin/kube-proxy"), &b); err != nil || a.Ino != b.Ino {
		t.Errorf("/usr/local/bin/kube-proxy: %v, inode %d; want a hard link to /userproxy (inode %d)", err, b.Ino, a.Ino)
	}

	// 4. userproxy version in the image, with NET_ADMIN granted (as the
	// manifests do) ...
	start = time.Now()
	out := must(append(buildah, "run", "--isolation", "chroot", "--cap-add", "CAP_NET_ADMIN", ctr, "--", "/userproxy", "version")...)
	t.Logf("buildah run userproxy version: %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
	if want := "userproxy " + version + "\n"; !strings.HasPrefix(out, want) {
		t.Errorf("userproxy version printed %q, want it to start with %q", out, want)
	}
	out = must(append(buildah, "run", "--isolation", "chroot", "--cap-add", "CAP_NET_ADMIN", ctr, "--", "/usr/local/bin/kube-proxy", "--version")...)
	if want := "Kubernetes v1.37.2 (userproxy " + version + ")\n"; out != want {
		t.Errorf("kube-proxy --version printed %q, want %q", out, want)
	}
	// ... and without it: the kernel refuses a binary whose file
	// capabilities it cannot grant.
	if out, err := run(append(buildah, "run", "--isolation", "chroot", ctr, "--", "/userproxy", "version")...); err == nil || !strings.Contains(out, "operation not permitted") {
		t.Errorf("without NET_ADMIN: %v, %q; want operation not permitted", err, out)
	}
}

// checkFileCaps checks that path carries exactly cap_net_admin=ep: a
// vfs_cap_data (linux/capability.h) whose permitted set is CAP_NET_ADMIN
// alone, with the effective bit and no inheritable set.
func checkFileCaps(t *testing.T, path string) {
	t.Helper()
	buf := make([]byte, 64)
	n, err := unix.Getxattr(path, "security.capability", buf)
	if err != nil {
		t.Errorf("%s: no file capabilities: %v", path, err)
		return
	}
	if n != 20 { // VFS_CAP_U32_2: magic, then two (permitted, inheritable) pairs
		t.Errorf("%s: security.capability of %d bytes, want 20 (revision 2)", path, n)
		return
	}
	le := binary.LittleEndian
	magic := le.Uint32(buf[0:])
	const revision2, effective = 0x02000000, 0x1
	perm := uint64(le.Uint32(buf[4:])) | uint64(le.Uint32(buf[12:]))<<32
	inh := uint64(le.Uint32(buf[8:])) | uint64(le.Uint32(buf[16:]))<<32
	if magic != revision2|effective || perm != 1<<unix.CAP_NET_ADMIN || inh != 0 {
		t.Errorf("%s: capabilities magic %#x permitted %#x inheritable %#x, want cap_net_admin=ep", path, magic, perm, inh)
	}
}

// checkStaticBuild checks how the binary was built: no interpreter or shared
// libraries, CGO_ENABLED=0 and -trimpath (which keeps -ldflags out of the
// build information: `userproxy version` shows the stamp).
func checkStaticBuild(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s: has %v: not static", path, p.Type)
		}
	}
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range info.Settings {
		got[s.Key] = s.Value
	}
	if got["CGO_ENABLED"] != "0" || got["-trimpath"] != "true" {
		t.Errorf("%s built with CGO_ENABLED=%q -trimpath=%q; want 0 and true", path, got["CGO_ENABLED"], got["-trimpath"])
	}
}
