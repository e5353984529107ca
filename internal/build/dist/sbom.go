package main

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

// An SBOM (CycloneDX JSON) per artifact: the artifact, the binary it holds
// and every module linked into that binary, read from the binary's own build
// information (debug/buildinfo), so it lists exactly what is linked: no
// module of the build's graph that the binary does not contain, and the
// version each replace directive put in place.

// subject is the artifact an SBOM describes.
type subject struct {
	file string            // its name in the release directory
	kind cdx.ComponentType // application (binary, deb, rpm) or container (image)
	purl string
}

// sbomName is the file an artifact's SBOM goes to.
func sbomName(artifact string) string { return artifact + ".cdx.json" }

func fileSHA256(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// writeSBOM writes the SBOM of the artifact sub, which holds the binary bin,
// into dir.
func writeSBOM(dir string, sub subject, bin string, st stamp) (string, error) {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "", fmt.Errorf("build information of %s: %w", bin, err)
	}
	artifactSum, err := fileSHA256(filepath.Join(dir, sub.file))
	if err != nil {
		return "", err
	}
	binSum, err := fileSHA256(bin)
	if err != nil {
		return "", err
	}
	version := strings.TrimPrefix(st.Version, "v")

	bom := cdx.NewBOM()
	bom.SerialNumber = "urn:uuid:" + uuid5("sha256:"+artifactSum)
	artifact := cdx.Component{
		BOMRef:     sub.file,
		Type:       sub.kind,
		Name:       sub.file,
		Version:    version,
		Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: artifactSum}},
		PackageURL: sub.purl,
	}
	bom.Metadata = &cdx.Metadata{
		Timestamp: st.Time.Format("2006-01-02T15:04:05Z"),
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{
			Type: cdx.ComponentTypeApplication, Name: "make release (internal/build/dist)",
		}}},
		Component: &artifact,
		Properties: &[]cdx.Property{
			{Name: "kube-etcd-migrate:commit", Value: st.Commit},
			{Name: "kube-etcd-migrate:release", Value: fmt.Sprint(st.Release)},
		},
	}

	// The binary: what it was built with, then every module it links.
	binaryRef := "binary:" + filepath.Base(bin)
	var settings []cdx.Property
	for _, s := range bi.Settings {
		settings = append(settings, cdx.Property{Name: "go:build:" + s.Key, Value: s.Value})
	}
	modules, moduleRefs := linkedModules(bi)
	var components []cdx.Component
	binaryDeps := append([]string{goRef(bi)}, moduleRefs...)
	deps := []cdx.Dependency{}
	if sub.file == filepath.Base(bin) {
		// The binary's own SBOM: it is the artifact.
		artifact.Properties = &settings
		deps = append(deps, cdx.Dependency{Ref: artifact.BOMRef, Dependencies: &binaryDeps})
	} else {
		components = append(components, cdx.Component{
			BOMRef:     binaryRef,
			Type:       cdx.ComponentTypeApplication,
			Name:       "kube-etcd-migrate",
			Version:    version,
			Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: binSum}},
			Properties: &settings,
		})
		deps = append(deps,
			cdx.Dependency{Ref: artifact.BOMRef, Dependencies: &[]string{binaryRef}},
			cdx.Dependency{Ref: binaryRef, Dependencies: &binaryDeps})
	}
	components = append(components, cdx.Component{
		BOMRef:      goRef(bi),
		Type:        cdx.ComponentTypeLibrary,
		Name:        "stdlib",
		Version:     bi.GoVersion,
		Description: "the Go toolchain's standard library and runtime",
		PackageURL:  goRef(bi),
	})
	components = append(components, modules...)
	bom.Components = &components
	bom.Dependencies = &deps

	var out bytes.Buffer
	if err := cdx.NewBOMEncoder(&out, cdx.BOMFileFormatJSON).SetPretty(true).Encode(bom); err != nil {
		return "", err
	}
	name := sbomName(sub.file)
	return name, os.WriteFile(filepath.Join(dir, name), out.Bytes(), 0o644)
}

func goRef(bi *debug.BuildInfo) string { return "pkg:golang/stdlib@" + bi.GoVersion }

// linkedModules are the components of the modules the binary links, in the
// order its build information lists them, with the version that is linked
// (a replace directive's).
func linkedModules(bi *debug.BuildInfo) ([]cdx.Component, []string) {
	var comps []cdx.Component
	var refs []string
	for _, d := range bi.Deps {
		m := d
		var props []cdx.Property
		if d.Replace != nil {
			props = append(props, cdx.Property{Name: "go:module:replaces", Value: d.Path + "@" + d.Version})
			m = d.Replace
		}
		if m.Sum != "" {
			props = append(props, cdx.Property{Name: "go:module:sum", Value: m.Sum})
		}
		purl := "pkg:golang/" + m.Path + "@" + m.Version
		c := cdx.Component{BOMRef: purl, Type: cdx.ComponentTypeLibrary, Name: m.Path, Version: m.Version, PackageURL: purl}
		if len(props) > 0 {
			c.Properties = &props
		}
		comps = append(comps, c)
		refs = append(refs, purl)
	}
	return comps, refs
}

// uuid5 is the name-based (SHA-1) UUID of name in the URL namespace: the
// same artifact, the same serial number.
func uuid5(name string) string {
	ns := []byte{0x6b, 0xa7, 0xb8, 0x11, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8}
	h := sha1.New()
	h.Write(ns)
	h.Write([]byte(name))
	u := h.Sum(nil)[:16]
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	x := hex.EncodeToString(u)
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}
