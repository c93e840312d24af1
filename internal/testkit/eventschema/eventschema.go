// Package eventschema validates published events against their JSON Schemas
// (api/events, one per detail-type), strictly: formats asserted, unknown
// members refused.
package eventschema

import (
	"bytes"
	"fmt"
	"io/fs"
	"strings"
	"sync"

	"github.com/holdfast/holdfast/api/events"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

var (
	once    sync.Once
	schemas map[string]*jsonschema.Schema
	loadErr error
)

// load compiles every schema once, offline: each is added as a resource,
// so nothing is fetched.
func load() (map[string]*jsonschema.Schema, error) {
	once.Do(func() {
		files, err := fs.Glob(events.Schemas, "*.json")
		if err != nil {
			loadErr = err
			return
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		out := map[string]*jsonschema.Schema{}
		for _, f := range files {
			body, err := events.Schemas.ReadFile(f)
			if err != nil {
				loadErr = err
				return
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
			if err != nil {
				loadErr = fmt.Errorf("schema %s: %w", f, err)
				return
			}
			loc := "mem:///api/events/" + f
			if err := c.AddResource(loc, doc); err != nil {
				loadErr = fmt.Errorf("schema %s: %w", f, err)
				return
			}
			sch, err := c.Compile(loc)
			if err != nil {
				loadErr = fmt.Errorf("schema %s: %w", f, err)
				return
			}
			out[strings.TrimSuffix(f, ".json")] = sch
		}
		schemas = out
	})
	return schemas, loadErr
}

// Types returns the detail-types that have a schema.
func Types() ([]string, error) {
	s, err := load()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(s))
	for t := range s {
		out = append(out, t)
	}
	return out, nil
}

// Validate checks an event's detail (its JSON) against the schema of its
// detail-type; a type without a schema is an error.
func Validate(detailType string, detail []byte) error {
	s, err := load()
	if err != nil {
		return err
	}
	sch, ok := s[detailType]
	if !ok {
		return fmt.Errorf("no schema for detail-type %q (api/events/%s.json)", detailType, detailType)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(detail))
	if err != nil {
		return fmt.Errorf("%s detail: %w", detailType, err)
	}
	if err := sch.Validate(doc); err != nil {
		return fmt.Errorf("%s detail %s: %w", detailType, detail, err)
	}
	return nil
}
