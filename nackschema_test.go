package mq

import (
	"bytes"
	"encoding/json"
	"errors"
	goflag "flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// NACK's CRD schema, as the manifest tests need it: for each kind WriteNATSManifests
// writes, the v1beta2 spec's fields with their types and enum values. It is kept in
// testdata/nack-schema.json so the tests run on a clean clone; a second test checks it
// against the upstream CRD when that is beside the repository.

const nackSchemaFile = "testdata/nack-schema.json"

var updateNACKSchema = goflag.Bool("update-nack-schema", false, "rewrite "+nackSchemaFile+" from the upstream CRD in ../shared")

// upstreamNACKCRD is NACK's CRD file, kept beside the repository for reading.
var upstreamNACKCRD = filepath.Join("..", "shared", "design", "reference", "upstream", "nack-crds.yml")

// nackSchemaKinds are the kinds the generator writes.
var nackSchemaKinds = []string{"Account", "Consumer", "Stream"}

// nackField is one field of a spec: its OpenAPI type, its enum values if any, the
// fields of an object, and the item of an array.
type nackField struct {
	Type   string               `json:"type"`
	Enum   []string             `json:"enum,omitempty"`
	Fields map[string]nackField `json:"fields,omitempty"`
	Items  *nackField           `json:"items,omitempty"`
}

// nackSchema maps a kind to its spec's fields.
type nackSchema map[string]map[string]nackField

// nackFieldOf condenses one OpenAPI property.
func nackFieldOf(prop map[string]any) nackField {
	f := nackField{}
	f.Type, _ = prop["type"].(string)
	for _, v := range asList(prop["enum"]) {
		f.Enum = append(f.Enum, fmt.Sprint(v))
	}
	if props, ok := prop["properties"].(map[string]any); ok {
		f.Fields = nackFieldsOf(props)
	}
	if items, ok := prop["items"].(map[string]any); ok {
		item := nackFieldOf(items)
		f.Items = &item
	}
	return f
}

func nackFieldsOf(props map[string]any) map[string]nackField {
	out := map[string]nackField{}
	for name, p := range props {
		if m, ok := p.(map[string]any); ok {
			out[name] = nackFieldOf(m)
		}
	}
	return out
}

// nackSchemaFromCRD reads the v1beta2 spec of each of nackSchemaKinds from NACK's CRD
// file.
func nackSchemaFromCRD(data []byte) (nackSchema, error) {
	schema := nackSchema{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var crd struct {
			Spec struct {
				Names    struct{ Kind string } `yaml:"names"`
				Versions []struct {
					Name   string `yaml:"name"`
					Schema struct {
						OpenAPIV3Schema struct {
							Properties struct {
								Spec struct {
									Properties map[string]any `yaml:"properties"`
								} `yaml:"spec"`
							} `yaml:"properties"`
						} `yaml:"openAPIV3Schema"`
					} `yaml:"schema"`
				} `yaml:"versions"`
			} `yaml:"spec"`
		}
		err := dec.Decode(&crd)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if !slices.Contains(nackSchemaKinds, crd.Spec.Names.Kind) {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if v.Name == "v1beta2" {
				schema[crd.Spec.Names.Kind] = nackFieldsOf(v.Schema.OpenAPIV3Schema.Properties.Spec.Properties)
			}
		}
	}
	for _, k := range nackSchemaKinds {
		if schema[k] == nil {
			return nil, fmt.Errorf("no v1beta2 %s in the CRD", k)
		}
	}
	return schema, nil
}

func loadNACKSchema(t *testing.T) nackSchema {
	t.Helper()
	data, err := os.ReadFile(nackSchemaFile)
	require.NoError(t, err)
	var s nackSchema
	require.NoError(t, json.Unmarshal(data, &s))
	return s
}

// TestNACKSchemaTestdataAgreesWithTheUpstreamCRD: the schema the manifest tests use is
// what NACK's CRD says. Run with -update-nack-schema to rewrite it after NACK changed.
func TestNACKSchemaTestdataAgreesWithTheUpstreamCRD(t *testing.T) {
	data, err := os.ReadFile(upstreamNACKCRD)
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("NACK's CRD is not beside the repository (%s); %s is checked against it where it is", upstreamNACKCRD, nackSchemaFile)
	}
	require.NoError(t, err)
	upstream, err := nackSchemaFromCRD(data)
	require.NoError(t, err)
	if *updateNACKSchema {
		out, err := json.MarshalIndent(upstream, "", " ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(nackSchemaFile, append(out, '\n'), 0o644))
	}
	assert.Equal(t, upstream, loadNACKSchema(t), "%s differs from %s: rerun with -update-nack-schema", nackSchemaFile, upstreamNACKCRD)
}

// schemaProblems lists what the field does not accept in value: a wrong type, a value
// outside its enum, or, inside an object or array, a field the schema does not know
// (Kubernetes silently drops those).
func schemaProblems(path string, value any, f nackField) []string {
	var typeOK bool
	switch value.(type) {
	case string:
		typeOK = f.Type == "string"
	case int, int64:
		typeOK = f.Type == "integer" || f.Type == "number"
	case float64:
		typeOK = f.Type == "number"
	case bool:
		typeOK = f.Type == "boolean"
	case []any:
		typeOK = f.Type == "array"
	case map[string]any:
		typeOK = f.Type == "object"
	}
	var problems []string
	if !typeOK {
		problems = append(problems, fmt.Sprintf("%s: %v (%T) is not NACK's type %s", path, value, value, f.Type))
	}
	if len(f.Enum) > 0 && !slices.Contains(f.Enum, fmt.Sprint(value)) {
		problems = append(problems, fmt.Sprintf("%s: %v is not one of NACK's values %v", path, value, f.Enum))
	}
	switch v := value.(type) {
	case map[string]any:
		if f.Fields != nil {
			problems = append(problems, specProblems(path, v, f.Fields)...)
		}
	case []any:
		if f.Items != nil {
			for i, item := range v {
				problems = append(problems, schemaProblems(fmt.Sprintf("%s[%d]", path, i), item, *f.Items)...)
			}
		}
	}
	return problems
}

func specProblems(path string, spec map[string]any, fields map[string]nackField) []string {
	var problems []string
	for name, value := range spec {
		if f, ok := fields[name]; ok {
			problems = append(problems, schemaProblems(path+"."+name, value, f)...)
		} else {
			problems = append(problems, path+"."+name+" is not in NACK's schema")
		}
	}
	return problems
}

// TestSpecProblems_CatchesAnUnknownFieldAWrongTypeAndAValueOutsideTheEnum keeps the
// schema check itself honest.
func TestSpecProblems_CatchesAnUnknownFieldAWrongTypeAndAValueOutsideTheEnum(t *testing.T) {
	stream := loadNACKSchema(t)["Stream"]
	for name, spec := range map[string]map[string]any{
		"unknown field":  {"maxAgeSeconds": 1},
		"wrong type":     {"maxBytes": "1Gi"},
		"outside enum":   {"retention": "forever"},
		"unknown nested": {"sources": []any{map[string]any{"stream": "X"}}},
	} {
		assert.Len(t, specProblems("Stream", spec, stream), 1, name)
	}
	assert.Empty(t, specProblems("Stream", map[string]any{"retention": "interest", "maxBytes": 5,
		"sources": []any{map[string]any{"name": "X"}}}, stream))
}
