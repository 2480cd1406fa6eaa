// gotar prints each member of a tar file as Go's archive/tar reads it: the reader
// the Docker engine, containerd and `docker load` unpack layers with. The tests
// (tests/test_go_tar.py) hold buildmatrix's tar reading to this view.
//
// Usage: gotar FILE... One JSON object per line: a member (name, type, size,
// linkname, xattrs, pax, sha256 of its data as Read returns it, sparse holes
// expanded), or {"error": ...} where Next or Read fails; nothing of that file
// follows an error. With several files, {"file": FILE} follows each file's lines.
package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"strings"
)

type member struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Size     int64             `json:"size"`
	Linkname string            `json:"linkname"`
	Xattrs   map[string]string `json:"xattrs"`
	PAX      map[string]string `json:"pax"`
	SHA256   string            `json:"sha256"`
}

func main() {
	out := json.NewEncoder(os.Stdout)
	for _, name := range os.Args[1:] {
		read(name, out)
		if len(os.Args) > 2 {
			_ = out.Encode(map[string]string{"file": name})
		}
	}
}

func read(name string, out *json.Encoder) {
	f, err := os.Open(name)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			_ = out.Encode(map[string]string{"error": err.Error()})
			return
		}
		digest := sha256.New()
		if _, err := io.Copy(digest, tr); err != nil {
			_ = out.Encode(map[string]string{"error": err.Error()})
			return
		}
		xattrs := map[string]string{}
		for k, v := range hdr.PAXRecords {
			if strings.HasPrefix(k, "SCHILY.xattr.") {
				xattrs[strings.TrimPrefix(k, "SCHILY.xattr.")] = v
			}
		}
		_ = out.Encode(member{
			Name:     hdr.Name,
			Type:     string([]byte{hdr.Typeflag}),
			Size:     hdr.Size,
			Linkname: hdr.Linkname,
			Xattrs:   xattrs,
			PAX:      hdr.PAXRecords,
			SHA256:   hex.EncodeToString(digest.Sum(nil)),
		})
	}
}
