// The syntax tree of a Jinja template (the node kinds of @huggingface/jinja's
// ast.ts), built by parser.h and walked by interpreter.h. Internal to
// swaserve::model_text. Immutable after parsing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace swaserve::model::jinja {

enum class NodeKind : uint8_t {
  // Statements
  kProgram,  // a: body
  kText,     // str: literal text between tags
  kComment,
  kIf,   // x: test, a: body, b: alternate (an elif is one nested kIf)
  kFor,  // x: target (kIdentifier | kTuple), y: iterable (a kSelect
         // for `for x in y if cond`), a: body, b: else block
  kBreak,
  kContinue,
  kSet,          // x: target, y: value (null for a block set), a: block body
  kMacro,        // str: name, a: parameters (kIdentifier | kKeywordArg),
                 // b: body
  kCallBlock,    // x: the kCall, a: caller parameters, b: body
  kFilterBlock,  // x: filter (kIdentifier | kCall), a: body
  // Expressions
  kIntLiteral,     // num
  kFloatLiteral,   // num
  kStringLiteral,  // str
  kIdentifier,     // str
  kArray,          // a: elements
  kTuple,          // a: elements
  kObject,         // a: keys, b: values
  kMember,         // x: object, y: property, flag: computed (obj[expr])
  kSlice,          // x: start, y: stop, z: step (each may be null)
  kCall,           // x: callee, a: arguments
  kKeywordArg,     // str: name, x: value
  kSpread,         // x: *expr
  kKwSpread,       // x: **expr
  kUnary,          // str: "not" | "-" | "+", x: operand
  kBinary,         // str: operator, x: left, y: right
  kFilter,         // x: operand, y: filter (kIdentifier | kCall)
  kTest,           // x: operand, str: test name, flag: negated (`is not`)
  kSelect,         // x: value, y: condition (`value if condition`)
  kTernary,        // x: condition, y: if true, z: if false
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  NodeKind kind = NodeKind::kProgram;
  uint32_t pos = 0;  // byte offset in the template, for error messages
  bool flag = false;
  double num = 0;
  std::string str;
  NodePtr x, y, z;
  std::vector<NodePtr> a, b;
};

}  // namespace swaserve::model::jinja
