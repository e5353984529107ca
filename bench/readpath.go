package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/customresource"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The read path: kube-apiserver's own read of every object of the keyspace
// (decrypt with the target configuration, then decode as its storage layer
// does on a GET: the versioning codec and defaulting for built-ins;
// apiextensions-apiserver's JSON decode, pruning, metadata coercion and
// structural defaults for custom resources), in this process, one worker a
// core, with no etcd beside it: the values are fetched first, untimed. It
// writes nothing and decides nothing. A tool that reads each object the way
// kube-apiserver reads it cannot go faster on the same cores, so it bounds
// migrate and verify from above wherever the CAS or scan ceiling (which
// decode nothing) is higher.

const mReadPath = "read path (no etcd)"

// crDecoder adapts the widget codec to decode.CustomResourceDecoder.
type crDecoder struct{ *customresource.Codec }

func (c crDecoder) DecodeStored(plaintext []byte) (*unstructured.Unstructured, schema.GroupVersionKind, string, error) {
	u, info, err := c.Decode(plaintext)
	mt := decode.MediaTypeJSON
	if info.MediaType == customresource.MediaTypeCBOR {
		mt = decode.MediaTypeCBOR
	}
	return u, info.GVK, mt, err
}

// readPath fetches every value under /registry, then decodes each once on
// runtime.GOMAXPROCS workers; the sample's CPU is this process's over the
// decoding.
func readPath(ctx context.Context, cli *clientv3.Client, g *generator, enc *encryption.Transformers) (sample, error) {
	var kvs []etcdscan.KV
	var size int64
	if _, _, err := rawScan(ctx, cli, "/registry/", etcdscan.DefaultPageSize, func(page []rawKV) error {
		for _, kv := range page {
			kvs = append(kvs, etcdscan.KV{Key: string(kv.key), Value: kv.value, ModRevision: kv.modRev})
			size += int64(len(kv.value))
		}
		return nil
	}); err != nil {
		return sample{}, fmt.Errorf("read path: fetching the values: %w", err)
	}
	dec := decode.NewDecoder(decode.NewResolver("/registry", g.current), g.current, enc)
	dec.AddCustomResource(schema.GroupResource{Group: crGroup, Resource: "widgets"}, crDecoder{g.crCodec})
	runtime.GC()

	var next, failed atomic.Int64
	var firstErr atomic.Value
	cpu0 := processCPU()
	start := time.Now()
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(len(kvs)) {
					return
				}
				if _, err := dec.Decode(ctx, kvs[i]); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), processCPU()-cpu0
	if n := failed.Load(); n > 0 {
		return sample{}, fmt.Errorf("read path: %d of %d values did not decode, the first: %v", n, len(kvs), firstErr.Load())
	}
	return sample{Seconds: elapsed.Seconds(), CPUSeconds: cpu.Seconds(), Objects: int64(len(kvs)), Bytes: size}, nil
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
