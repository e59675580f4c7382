package descriptors

import (
	"github.com/leapgate/leapgate/window"

	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// File is one rule file's name (used in errors) and content.
type File struct {
	Name string
	Data []byte
}

// Options adjust how rule files become a Set. The zero value is
// envoyproxy/ratelimit's default.
type Options struct {
	// MergeDomains (MERGE_DOMAIN_CONFIG) lets several files define one
	// domain: their top-level descriptors are merged into it, and a
	// descriptor one file defines again is still an error. Without it a
	// domain defined twice is an error.
	MergeDomains bool
	// ChargeAlways (DEFAULT_CHARGE=always) is the charge of every limit
	// that does not set one, where its algorithm serves it: sliding_window
	// and fixed_window limits then record every hit, even one that does
	// not fit (see Limit.ChargeAlways); other algorithms keep recording
	// only what fits. For rule sets, such as xDS ones, that cannot say
	// charge themselves.
	ChargeAlways bool
	// DefaultBuckets (WINDOW_BUCKETS) is the number of buckets per window
	// of a time_buckets limit that does not set buckets; if 0,
	// window.DefaultBuckets. A limit whose window it does not divide is
	// refused with its file and line.
	DefaultBuckets int
}

// defaultBuckets returns DefaultBuckets, or window.DefaultBuckets if 0.
func (o Options) defaultBuckets() int {
	if o.DefaultBuckets > 0 {
		return o.DefaultBuckets
	}
	return window.DefaultBuckets
}

// Parse builds a Set from rule files in memory, in the order given (a domain
// defined twice is reported at its second definition). Every error found in
// any file is returned, as an errors.Join of *Error; the Set is returned only
// when there is none.
func Parse(files []File, opts Options) (*Set, error) {
	return parse(files, nil, opts)
}

// parse is Parse with errors found before parsing, such as unreadable files.
func parse(files []File, errs []error, opts Options) (*Set, error) {
	b := newBuilder(opts)
	b.errs = errs
	for _, f := range files {
		raw, errs := parseYAML(f.Name, f.Data)
		b.errs = append(b.errs, errs...)
		if raw != nil {
			b.addFile(raw)
		}
	}
	return b.result()
}

// Load reads the rule files of the directory dir and its subdirectories:
// every file, whatever its name (as envoyproxy/ratelimit reads them, so a
// ConfigMap key such as "ratelimit-config" is a rule file), in lexical order
// of path. Names starting with a dot are skipped, files and directories
// alike (Kubernetes mounts a ConfigMap as symlinks into a ..data directory;
// the symlinks are read, ..data is not).
// Symlinks to files are followed; symlinks to directories are not. Errors in
// the files are reported as by Parse, with the file's path under dir; a rule
// file that cannot be read (a dangling symlink, say) is an *Error too, which
// wraps the fs error. A directory that cannot be read is an error wrapping
// the fs error (errors.Is(err, fs.ErrNotExist) when it does not exist).
func Load(dir string, opts Options) (*Set, error) {
	return loadFS(os.DirFS(dir), ".", func(rel string) string { return filepath.Join(dir, filepath.FromSlash(rel)) }, opts)
}

// LoadFS is Load on the directory dir of fsys. File names in errors are
// paths in fsys.
func LoadFS(fsys fs.FS, dir string, opts Options) (*Set, error) {
	return loadFS(fsys, dir, func(rel string) string { return rel }, opts)
}

func loadFS(fsys fs.FS, dir string, display func(string) string, opts Options) (*Set, error) {
	files, readErrs, err := readRuleFiles(fsys, dir, display)
	if err != nil {
		return nil, err
	}
	return parse(files, readErrs, opts)
}

// isRuleFile reports whether a directory entry name is a rule file name:
// any name that does not start with a dot.
func isRuleFile(name string) bool {
	return !strings.HasPrefix(name, ".")
}

// readRuleFiles reads the rule files under dir, naming each with display.
// Files that cannot be read are returned as *Error values; err reports a
// directory that cannot be walked.
func readRuleFiles(fsys fs.FS, dir string, display func(string) string) (files []File, fileErrs []error, err error) {
	err = fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != dir && strings.HasPrefix(name, ".") {
				return fs.SkipDir
			}
			return nil
		}
		if !isRuleFile(name) {
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			info, err := fs.Stat(fsys, p)
			if err != nil {
				fileErrs = append(fileErrs, &Error{File: display(p), Reason: "error reading config file: " + err.Error(), err: err})
				return nil
			}
			if !info.Mode().IsRegular() {
				return nil // a symlink to a directory or device
			}
		} else if !d.Type().IsRegular() {
			return nil
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			fileErrs = append(fileErrs, &Error{File: display(p), Reason: "error reading config file: " + err.Error(), err: err})
			return nil
		}
		files = append(files, File{Name: display(p), Data: data})
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("descriptors: loading rules from %s: %w", display(dir), err)
	}
	return files, fileErrs, nil
}
