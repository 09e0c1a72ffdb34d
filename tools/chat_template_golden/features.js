// Hand-written templates exercising the interpreter feature by feature
// (make_golden.js renders them with @huggingface/jinja; the C++ test must
// match byte for byte, errors included). Each: { name, source, context? }.
"use strict";

const ctx = {
  s: "Hello World",
  u: "héllo 😀 wörld",
  n: 42,
  f: 2.5,
  neg: -7,
  t: true,
  z: null,
  xs: [3, 1, 2],
  words: ["banana", "Apple", "cherry", "apple"],
  d: { b: 1, a: [1, 2], c: { x: "y" } },
  users: [
    { name: "ann", age: 31, admin: true, tags: ["a"] },
    { name: "Bob", age: 25, admin: false },
    { name: "cy", age: 40 },
  ],
  msg: { role: "user", content: "hi", items: "shadowed" },
  numkeys: { b: 1, 2: "two", 1: "one", a: 0 },
};

const F = [];
const add = (name, source, context = ctx) => F.push({ name, source, context });

// Whitespace control, comments, trim_blocks / lstrip_blocks.
add("ws_plain", "a {{ s }} b\n");
add("ws_dash_both", "a   {{- s -}}   b");
add("ws_statement_dash", "x  \n  {%- if t -%}  \n  y  \n  {%- endif -%}  \n  z");
add("ws_lstrip_trim_blocks", "start\n    {% if t %}\n    inside\n    {% endif %}\nend\n");
add("ws_lstrip_only_at_line_start", "a {% if t %}b{% endif %}\n  c");
add("ws_comment", "a\n  {# a comment #}\nb {#- tight -#} c");
add("ws_expression_no_trim", "{{ s }}\n{{ n }}\n");
add("ws_trailing_newline_dropped", "x\n\n");
add("ws_generation_tag", "a {% generation %} b {% endgeneration %} c");
add("ws_generation_tag_dash", "a {%- generation -%} b {%- endgeneration %} c");
add("ws_crlf", "a\r\n  {% if t %}\r\nb\r\n{% endif %}\r\n");
add("ws_unicode_space_trim", "a\u3000\u00a0 {{- s }}");

// Literals and printing.
add("print_numbers", "{{ 1 }} {{ 1.0 }} {{ 1.5 }} {{ -0.0 }} {{ 100000000000000000000000 }} {{ 0.000001 }} {{ 0.0000001 }}");
add("print_arith", "{{ 10 / 4 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 3 * 1.0 }} {{ 6 / 3 }}");
add("print_bool_none_undefined", "[{{ true }}|{{ false }}|{{ none }}|{{ nothing }}|{{ True }}|{{ None }}]");
add("print_containers", "{{ [1, 'a', none, true, 1.5] }} {{ {'a': 1, 'b': [1, {'c': 'd'}]} }} {{ [] }} {{ {} }}");
add("print_context_containers", "{{ d }} {{ users[0] }} {{ numkeys }}");
add("print_tuple_fails", "{{ (1, 2) }}");
add("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\"f' }}|{{ \"\\u00e9\\x41\" }}|{{ 'x' 'y' \"z\" }}");
add("string_concat", "{{ 'a' ~ 1 ~ 2.5 ~ true }}|{{ 'n=' + n }}|{{ n ~ f }}|{{ 1.0 ~ '' }}|{{ xs ~ '' }}|{{ d ~ '' }}");
add("concat_none_fails", "{{ 'a' ~ none }}");
add("concat_undefined_fails", "{{ 'a' + nothing }}");
add("negative_literals", "{{ -1 }} {{ - 1 }} {{ -n }} {{ +f }} {{ -(3) }} {{ 1 - -1 }} {{ -t }}");

// Comparisons and logic.
add("logic_values", "{{ 0 or 'x' }}|{{ 'a' and 'b' }}|{{ [] or 'empty' }}|{{ {} and 'no' }}|{{ not 0 }}|{{ not not 'x' }}|{{ none or nothing }}");
add("comparisons", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 1 == 1.0 }} {{ 1 == '1' }} {{ 'a' == 'a' }} {{ none == nothing }} {{ t == 1 }} {{ xs == xs }} {{ [1] == [1] }} {{ 'a' != 'b' }}");
add("string_compare_fails", "{{ 'a' < 'b' }}");
add("membership", "{{ 'ell' in s }} {{ 2 in xs }} {{ 5 not in xs }} {{ 'a' in d }} {{ 'z' in d }} {{ 'x' in nothing }} {{ 'x' not in nothing }} {{ 2.0 in xs }} {{ '2' in xs }}");
add("membership_list_in_list_fails", "{{ [1] in [[1]] }}");
add("tests", "{{ n is number }} {{ f is integer }} {{ n is integer }} {{ s is string }} {{ d is mapping }} {{ xs is iterable }} {{ s is iterable }} {{ d is iterable }} {{ d is sequence }} {{ z is none }} {{ nothing is defined }} {{ nothing is undefined }} {{ t is boolean }} {{ t is true }} {{ t is false }} {{ n is odd }} {{ n is even }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ range is callable }} {{ s is not string }}");
add("test_odd_on_string_fails", "{{ s is odd }}");
add("unknown_test_fails", "{{ s is divisibleby }}");
add("ternary_select", "{{ 'yes' if t else 'no' }}|{{ 'yes' if z else 'no' }}|{{ 'shown' if t }}|{{ 'hidden' if z }}|{{ 'a' if false else 'b' if true else 'c' }}");

// Member access, indexing, slicing.
add("member_access", "{{ msg.role }} {{ msg['content'] }} {{ msg.items }} {{ d.c.x }} {{ d['a'][1] }} {{ xs[0] }} {{ xs[-1] }} {{ xs[5] }} {{ s[0] }} {{ s[-1] }} {{ u[1] }} {{ u[9] }} {{ u[-1] }} {{ nothing.attr }} {{ z.attr }} {{ users.0.name }}");
add("member_builtins", "{{ s.length }} {{ u.length }} {{ xs.length }} {{ d.get('b') }} {{ d.get('q', 'dflt') }} {{ d.get('q') }} {{ d.keys() }} {{ d.values() | length }}");
add("dict_int_key_fails", "{{ d[0] }}");
add("slices", "{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:2] }} {{ xs[-2:] }} {{ xs[1:-1] }} {{ xs[::2] }} {{ s[::-1] }} {{ u[1:8] }} {{ u[::-1] }} {{ xs[5:1:-1] }} {{ xs[2:0:-1] }} {{ s[-3:] }}");
add("slice_float_fails", "{{ xs[1.5:] }}");

// Filters.
add("filters_string", "{{ '  pad  ' | trim }}|{{ s | upper }}|{{ s | lower }}|{{ 'hello wORLD foo_bar x1y' | title }}|{{ 'hELLO world' | capitalize }}|{{ u | length }}|{{ u | upper }}|{{ 'ß' | upper }}");
add("filters_list", "{{ xs | first }} {{ xs | last }} {{ xs | length }} {{ xs | reverse }} {{ xs | sort }} {{ words | sort }} {{ words | sort(reverse=true) }} {{ words | sort(case_sensitive=true) }} {{ words | unique }} {{ [1, 1.0, '1', 1] | unique }} {{ xs | list }}");
add("filters_join", "{{ xs | join }}|{{ xs | join(', ') }}|{{ words | join(separator='-') }}|{{ 'abc' | join('.') }}|{{ [1, none, 'x', [2, 3], 1.0] | join('/') }}");
add("filters_default", "{{ nothing | default('dflt') }}|{{ '' | default('dflt') }}|{{ '' | default('dflt', true) }}|{{ z | default('d') }}|{{ 0 | default('d', boolean=true) }}");
add("filter_default_without_call_fails", "{{ nothing | default }}");
add("filters_numbers", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ '3.5e2' | float }} {{ 'abc' | float }} {{ 4.7 | int }} {{ -4.7 | int }} {{ 3 | float }} {{ -3 | abs }} {{ -2.5 | abs }} {{ n | string }} {{ f | string }} {{ t | int }} {{ t | string }} {{ 4.7 | int(0) }}");
add("filters_dict", "{{ d | items }} {{ d | length }} {{ d | dictsort }} {{ d | keys }} {{ {'b': 2, 'A': 1, 'c': 0} | dictsort }} {{ {'b': 2, 'A': 1, 'c': 0} | dictsort(by='value', reverse=true) }}");
add("filters_attr", "{{ users | selectattr('admin') | map(attribute='name') | join(',') }}|{{ users | rejectattr('admin') | map(attribute='name') | join(',') }}|{{ users | selectattr('name', 'equalto', 'cy') | length }}|{{ users | map(attribute='tags.0') | list }}|{{ users | map(attribute='admin', default='?') | list }}|{{ users | sort(attribute='age') | map(attribute='name') | join }}|{{ users | sort(attribute='name') | map(attribute='name') | join }}");
add("filters_indent", "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb\\n\\nc' | indent(2, true) }}|{{ 'a\\nb\\n\\nc' | indent(width=1, first=true, blank=true) }}");
add("filters_replace", "{{ s | replace('o', '0') }}|{{ s | replace('o', '0', 1) }}|{{ 'aaa' | replace('a', 'b', count=2) }}|{{ 'ab' | replace('', '-') }}|{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 2) }}");
add("filters_tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ [] | tojson(indent=2) }}|{{ {'e': []} | tojson(indent=4) }}|{{ u | tojson }}|{{ u | tojson(ensure_ascii=true) }}|{{ 'q\"\\\\\\n\\t\\x01' | tojson }}|{{ [1.0, 2.5, true, none, nothing] | tojson }}|{{ d | tojson(separators=(',', ':')) }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|{{ numkeys | tojson }}");
add("filters_safe_string", "{{ '<b>' | safe }} {{ xs | string }} {{ t | string }}");
add("filter_string_on_dict_fails", "{{ d | string }}");
add("filter_unknown_fails", "{{ s | frobnicate }}");
add("filter_first_empty_fails", "{{ [] | first }}");
add("filter_chain_on_expression", "{{ (s ~ '!') | upper }} {{ s | upper ~ '?' }} {{ -3 | abs }} {{ 1 + 2 | string }}");

// String methods.
add("string_methods", "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ ' hi \\n'.rstrip() }}|{{ s.startswith('Hell') }}|{{ s.startswith(('x', 'He')) }}|{{ s.endswith('ld') }}|{{ s.upper() }}|{{ s.lower() }}|{{ 'ab cd'.title() }}|{{ 'ab'.capitalize() }}");
add("string_split", "{{ 'a,b,,c'.split(',') }}|{{ '  a  b c '.split() }}|{{ 'a b c d'.split(none, 2) }}|{{ 'a,b,c,d'.split(',', 1) }}|{{ 'a,b,c'.split(',', -2) }}|{{ 'x</think>y</think>z'.split('</think>')[-1] }}|{{ 'abc'.split('zz') }}");
add("string_split_empty_fails", "{{ 'abc'.split('') }}");
add("string_method_missing", "{{ s.nosuch }}|{{ s.format is defined }}");
add("string_method_call_missing_fails", "{{ s.format(1) }}");

// Statements.
add("for_loop_vars", "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}");
add("for_filter_else", "{% for x in xs if x > 1 %}{{ x }}:{{ loop.index }},{% endfor %}|{% for x in [] %}no{% else %}empty{% endfor %}|{% for x in xs if x > 9 %}{{ x }}{% else %}none matched{% endfor %}");
add("for_dict_and_items", "{% for k in d %}{{ k }},{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k, v in numkeys | items %}{{ k }}{% endfor %}");
add("for_nested_loop_scope", "{% set x = 'outer' %}{% for x in xs %}{% set y = x %}{% endfor %}{{ x }}|{{ y }}|{% for a in [1, 2] %}{% for b in [3, 4] %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}");
add("for_break_continue", "{% for x in [1, 2, 3, 4, 5] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}[{{ x }}]{% endfor %}|{% for x in [1, 2] %}a{% if x == 2 %}b{% break %}{% endif %}c{% endfor %}");
add("for_range", "{% for i in range(3) %}{{ i }}{% endfor %}|{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}|{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}|{{ range(0) }}");
add("for_over_string_fails", "{% for c in s %}{{ c }}{% endfor %}");
add("for_tuple_unpack_tuple_fails", "{% for a, b in [(1, 2)] %}{{ a }}{% endfor %}");
add("if_elif_else", "{% for v in [0, 1, 2, 3] %}{% if v == 0 %}zero{% elif v == 1 %}one{% elif v == 2 %}two{% else %}many{% endif %},{% endfor %}");
add("set_forms", "{% set a = 1 %}{% set b, c = [2, 3] %}{% set block %}B{{ a }}{% endset %}{{ a }}{{ b }}{{ c }}{{ block }}|{% set ns = namespace(count=0, items=[]) %}{% for x in xs %}{% set ns.count = ns.count + x %}{% set ns.items = ns.items + [x] %}{% endfor %}{{ ns.count }} {{ ns.items }} {{ ns }}");
add("set_if_leaks_scope", "{% if t %}{% set inner = 'leaked' %}{% endif %}{{ inner }}");
add("namespace_forms", "{% set a = namespace({'x': 1}, y=2) %}{{ a.x }}{{ a.y }}|{% set b = namespace([['k', 'v']]) %}{{ b.k }}|{{ namespace() }}");
add("set_attr_on_dict_fails", "{% set d.x = 1 %}");
add("macros", "{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ greet('ann') }}|{{ greet('bob', 'Hi') }}|{{ greet('cy', punct='?') }}|{{ greet(name='dee', greeting='Yo') }}");
add("macro_kwargs_varargs", "{% macro m(a) %}{{ a }}:{{ varargs }}:{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}");
add("macro_extra_kwarg_fails", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, b=2) }}");
add("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * (fact(n - 1) | int) }}{% endif %}{% endmacro %}{{ fact(6) }}");
add("macro_dynamic_scope", "{% macro show() %}{{ who }}{% endmacro %}{% for who in ['a', 'b'] %}{{ show() }}{% endfor %}");
add("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ n }}{% endcall %}|{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each(xs) %}[{{ x }}]{% endcall %}");
add("filter_block", "{% filter upper %}hello {{ s }}{% endfilter %}|{% filter replace('l', 'L') %}hello{% endfilter %}");
add("raise_exception", "{% if t %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}");
add("call_undefined_fails", "{{ nothing() }}");
add("call_spread_args", "{% macro m(a, b, c='c') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(*[1, 2]) }}|{{ m(1, **{'b': 2, 'c': 3}) }}");
add("strftime_defined", "{{ strftime_now is defined }}");

// Syntax errors.
add("syntax_unclosed_expression", "{{ s ");
add("syntax_unclosed_block", "{% if t %}x");
add("syntax_unknown_statement", "{% include 'x.html' %}");
add("syntax_bad_token", "{{ s @ n }}");
add("syntax_unterminated_string", "{{ 'abc }}");
add("syntax_endif_without_if", "a{% endif %}");
add("syntax_unclosed_comment", "a {# never closed");
add("syntax_empty_brackets", "{{ xs[] }}");
add("syntax_keyword_before_positional", "{{ range(stop=3, 1) }}");

module.exports = { features: F, ctx };
