// gojson prints what Go's encoding/json reads from image documents: the oracle of
// tests/test_go_json.py. The structs carry the JSON tags of the structs the engine
// and containerd unmarshal into (opencontainers/image-spec specs-go/v1 Manifest,
// Index, Descriptor, Platform, Image, ImageConfig, RootFS; moby image/tarexport
// manifestItem); encoding/json's key matching is what is under test.
//
// Usage: gojson KIND < DOCUMENT, KIND one of manifest, config, saveentry. Prints one
// JSON object: the fields as Go read them, or {"error": ...}.
package main

import (
	"encoding/json"
	"io"
	"os"
)

type platform struct {
	Architecture string   `json:"architecture"`
	OS           string   `json:"os"`
	OSVersion    string   `json:"os.version,omitempty"`
	OSFeatures   []string `json:"os.features,omitempty"`
	Variant      string   `json:"variant,omitempty"`
}

type descriptor struct {
	MediaType string    `json:"mediaType"`
	Digest    string    `json:"digest"`
	Size      int64     `json:"size"`
	Platform  *platform `json:"platform,omitempty"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType,omitempty"`
	Config        *descriptor  `json:"config,omitempty"`
	Layers        []descriptor `json:"layers,omitempty"`
	Manifests     []descriptor `json:"manifests,omitempty"`
}

type runConfig struct {
	Env    []string          `json:"Env,omitempty"`
	Labels map[string]string `json:"Labels,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type config struct {
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Variant      string    `json:"variant,omitempty"`
	Config       runConfig `json:"config,omitempty"`
	RootFS       rootFS    `json:"rootfs"`
}

type saveEntry struct {
	Config   string
	RepoTags []string
	Layers   []string
}

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		panic(err)
	}
	var out any
	switch os.Args[1] {
	case "manifest":
		var m manifest
		err, out = json.Unmarshal(data, &m), m
	case "config":
		var c config
		err, out = json.Unmarshal(data, &c), c
	case "saveentry":
		var e []saveEntry
		err, out = json.Unmarshal(data, &e), e
	}
	if err != nil {
		out = map[string]string{"error": err.Error()}
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}
