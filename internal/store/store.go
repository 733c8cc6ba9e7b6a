// Package store persists the daemon's sandbox records in one bbolt file,
// <statedir>/warren.db, so that a restarted daemon can find (adopt) the
// sandboxes an earlier one created.
//
// Writes are not fsync'ed. A record describes processes, mounts and
// cgroups that live exactly as long as the kernel does: a daemon that
// crashes or is killed leaves its writes in the page cache, where the next
// daemon reads them, and a machine that crashes takes the sandboxes along
// with whatever did not reach the disk. Each commit's two fdatasyncs were
// ~10% of the CPU of a create and delete. What an unsynced file may be
// after a crash is guarded by the boot mark, <statedir>/warren.db.boot:
// the kernel boot id the file was last written in. A file from an ended
// boot is moved to warren.db.prev-boot and what can still be read of it
// is copied into a new one (its sandboxes are gone; the daemon marks them
// dead). Where the boot id cannot be read, every commit is synced.
package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/atomicfile"
	"github.com/warrenrl/warren/internal/errdefs"
)

// FileName is the name of the database file inside the state directory.
const FileName = "warren.db"

var bucketSandboxes = []byte("sandboxes")

// Record is what the daemon keeps about one sandbox.
type Record struct {
	ID      string
	Backend string
	// BackendState is the opaque blob of backend.Sandbox.State().
	BackendState []byte
	// ImageLayers are the layer digests (bottom first) of the image the
	// sandbox was created from, so a restarted daemon takes the same
	// layers again even if the image name was re-imported since.
	ImageLayers []string
	// Sandbox is the API view of the sandbox; its State field is the
	// sandbox's lifecycle state.
	Sandbox *warrenv1.Sandbox
	// EtcNameserver is the nameserver the /etc/resolv.conf Warren last
	// wrote into the sandbox names: "" for mode none's, which names none
	// (records of daemons before it say that too). Commits leave that
	// file out, and a network change rewrites it only while it is that.
	EtcNameserver string
	// Bases are directories of the daemon's, top first, that sit above
	// the image layers as lower layers: a forked checkpoint's writable
	// layer, shared by the forks and their source (daemon fork.go).
	Bases []string
}

// State is the lifecycle state of the record.
func (r Record) State() warrenv1.SandboxState { return r.Sandbox.GetState() }

// encoded is the on-disk form: JSON with the proto as wire bytes, so that
// the proto can evolve with its own compatibility rules.
type encoded struct {
	ID           string   `json:"id"`
	Backend      string   `json:"backend"`
	BackendState []byte   `json:"backend_state,omitempty"`
	ImageLayers  []string `json:"image_layers,omitempty"`
	Sandbox      []byte   `json:"sandbox"`
	Nameserver   string   `json:"etc_nameserver,omitempty"`
	Bases        []string `json:"bases,omitempty"`
}

// Store is the sandbox database. It is safe for concurrent use.
type Store struct {
	db *bolt.DB
	// Salvaged is set when Open found a file of an ended boot.
	Salvaged *Salvage
}

// Open opens (creating when needed) <dir>/warren.db. It fails with category
// Unavailable when another daemon holds the file.
func Open(dir string) (*Store, error) {
	if dir == "" {
		return nil, errdefs.Invalidf("store: empty state directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errdefs.Wrap(writeCategory(err), err, "store: create state directory")
	}
	path := filepath.Join(dir, FileName)
	boot := bootID()
	mark := path + ".boot"
	prev, _ := os.ReadFile(mark)
	var salvaged *Salvage
	if boot != "" && len(prev) > 0 && string(prev) != boot {
		var err error
		if salvaged, err = salvage(path); err != nil {
			return nil, err
		}
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, errdefs.New(errdefs.Unavailable, "store: %s is locked (is another warren daemon running?): %w", path, err)
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "store: open "+path)
	}
	// Concurrent creates are group-committed by Batch; keep the added
	// latency of a lone write small.
	db.MaxBatchDelay = time.Millisecond
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketSandboxes)
		if err != nil || salvaged == nil {
			return err
		}
		for _, kv := range salvaged.records {
			if err := b.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && boot != "" && string(prev) != boot {
		// Synced before the first unsynced commit: a crash from here on
		// is known to have happened in this boot.
		err = atomicfile.Write(mark, FileName+".boot-", []byte(boot), 0o600)
	}
	if err != nil {
		_ = db.Close()
		return nil, errdefs.Wrap(writeCategory(err), err, "store: init "+path)
	}
	db.NoSync = boot != ""
	return &Store{db: db, Salvaged: salvaged}, nil
}

// Salvage reports what Open did with a file left by an ended boot.
type Salvage struct {
	// Records is how many sandbox records were copied into the new file.
	Records int
	// Err, if not nil, is why the rest of the old file could not be read.
	Err error
	// Kept is where the old file now is.
	Kept string

	records [][2][]byte
}

// salvage moves path (written unsynced in an ended boot, so possibly torn)
// aside and reads what records it can from it. bbolt trusts its pages and
// may panic on torn ones: that is recovered, and ends the reading.
func salvage(path string) (*Salvage, error) {
	kept := path + ".prev-boot"
	if err := os.Rename(path, kept); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, errdefs.Wrap(errdefs.Internal, err, "store: move aside the file of an ended boot")
	}
	sv := &Salvage{Kept: kept}
	func() {
		defer func() {
			if r := recover(); r != nil {
				sv.Err = fmt.Errorf("torn file: %v", r)
			}
		}()
		old, err := bolt.Open(kept, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
		if err != nil {
			sv.Err = err
			return
		}
		defer old.Close()
		sv.Err = old.View(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketSandboxes)
			if b == nil {
				return nil
			}
			return b.ForEach(func(k, v []byte) error {
				if _, err := decode(v); err != nil {
					return err
				}
				sv.records = append(sv.records, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
				return nil
			})
		})
	}()
	sv.Records = len(sv.records)
	return sv, nil
}

// bootID is the kernel's id of this boot, "" if it cannot be read.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Path is the database file.
func (s *Store) Path() string { return s.db.Path() }

// Close closes the database.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return errdefs.Wrap(errdefs.Internal, err, "store: close")
	}
	return nil
}

// Put inserts or replaces the record of r.ID.
func (s *Store) Put(r Record) error {
	if r.ID == "" {
		return errdefs.Invalidf("store: record without id")
	}
	if r.Sandbox == nil {
		return errdefs.Invalidf("store: record %s without sandbox", r.ID)
	}
	val, err := Encode(r)
	if err != nil {
		return err
	}
	err = s.db.Batch(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Put([]byte(r.ID), val)
	})
	if err != nil {
		return errdefs.Wrap(writeCategory(err), err, "store: put "+r.ID)
	}
	return nil
}

// Get returns the record of id, or an error of category NotFound.
func (s *Store) Get(id string) (Record, error) {
	var rec Record
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketSandboxes).Get([]byte(id))
		if v == nil {
			return errdefs.NotFoundf("store: no record for sandbox %s", id)
		}
		var err error
		rec, err = decode(v)
		return err
	})
	return rec, err
}

// Delete removes the record of id; a missing record is not an error.
func (s *Store) Delete(id string) error {
	err := s.db.Batch(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Delete([]byte(id))
	})
	if err != nil {
		return errdefs.Wrap(writeCategory(err), err, "store: delete "+id)
	}
	return nil
}

// List returns every record, sorted by id.
func (s *Store) List() ([]Record, error) {
	var recs []Record
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).ForEach(func(k, v []byte) error {
			rec, err := decode(v)
			if err != nil {
				return err
			}
			recs = append(recs, rec)
			return nil
		})
	})
	if err != nil {
		if errdefs.CategoryOf(err) == errdefs.Unknown {
			err = errdefs.Wrap(errdefs.Internal, err, "store: list")
		}
		return nil, err
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].ID < recs[j].ID })
	return recs, nil
}

// Encode is a record in the store's on-disk form (Decode reads it back):
// for copies of a record kept outside the store.
func Encode(r Record) ([]byte, error) {
	pb, err := proto.Marshal(r.Sandbox)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "store: encode sandbox "+r.ID)
	}
	val, err := json.Marshal(encoded{ID: r.ID, Backend: r.Backend, BackendState: r.BackendState, ImageLayers: r.ImageLayers, Sandbox: pb, Nameserver: r.EtcNameserver, Bases: r.Bases})
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Internal, err, "store: encode record "+r.ID)
	}
	return val, nil
}

// Decode reads a record Encode wrote.
func Decode(v []byte) (Record, error) { return decode(v) }

// Sync makes every record written so far durable. Within a boot the
// store does not sync its commits (a running sandbox dies with the
// machine); a record that must outlive a reboot (a hibernated sandbox's)
// is followed by Sync.
func (s *Store) Sync() error {
	if err := s.db.Sync(); err != nil {
		return errdefs.Wrap(writeCategory(err), err, "store: sync")
	}
	return nil
}

func decode(v []byte) (Record, error) {
	var e encoded
	if err := json.Unmarshal(v, &e); err != nil {
		return Record{}, errdefs.Wrap(errdefs.Internal, err, "store: decode record")
	}
	sb := &warrenv1.Sandbox{}
	if err := proto.Unmarshal(e.Sandbox, sb); err != nil {
		return Record{}, errdefs.Wrap(errdefs.Internal, err, fmt.Sprintf("store: decode sandbox %s", e.ID))
	}
	return Record{ID: e.ID, Backend: e.Backend, BackendState: e.BackendState, ImageLayers: e.ImageLayers, Sandbox: sb, EtcNameserver: e.Nameserver, Bases: e.Bases}, nil
}

// writeCategory tells a full disk (the caller may free space and retry)
// from other write failures.
func writeCategory(err error) errdefs.Category {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return errdefs.Exhausted
	}
	return errdefs.Internal
}
