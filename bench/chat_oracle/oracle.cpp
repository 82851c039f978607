// The vendored llama.cpp's own chat parser as a command: reads JSON lines {template (a file),
// messages, tools, tool_choice, parallel_tool_calls, reasoning_format, enable_thinking, input}
// and writes JSON lines {format, whole | whole_error, partial | partial_error}: the message
// common_chat_parse gives for `input` as the end of the output (whole) and mid-stream
// (partial), or the error it raises; with {template, caps: true}: {caps} (/props
// chat_template_caps); with {template, analysis: true}: {analysis} (the auto-parser's
// differential analysis of the template, common/chat-diff-analyzer.cpp, every field). A parse
// job's answer also carries the request's grammar_lazy, grammar_triggers and preserved_tokens
// (what llama.cpp holds the model to). Built by bench/malformed_calls.py.
#include "chat.h"
#include "chat-auto-parser.h"
#include <nlohmann/json.hpp>
#include <fstream>
#include <iostream>
#include <sstream>
using ojson = nlohmann::ordered_json;

static ojson msg_json(const common_chat_msg & m) {
    ojson calls = ojson::array();
    for (auto & c : m.tool_calls) calls.push_back({{"name", c.name}, {"arguments", c.arguments}, {"id", c.id}});
    return {{"content", m.content}, {"reasoning_content", m.reasoning_content}, {"tool_calls", calls}};
}

template <class T> static std::string name_of(T value) {
    std::ostringstream os; os << value; return os.str();
}

static ojson analysis_json(const std::string & source) {
    common_chat_template tmpl(source, "", "");
    autoparser::autoparser a;
    a.analyze_template(tmpl);
    auto & f = a.tools.format;
    auto & fn = a.tools.function;
    auto & args = a.tools.arguments;
    return {
        {"reasoning", {{"mode", name_of(a.reasoning.mode)}, {"start", a.reasoning.start}, {"end", a.reasoning.end}}},
        {"content", {{"mode", name_of(a.content.mode)}, {"start", a.content.start}, {"end", a.content.end}}},
        {"tools", {{"mode", name_of(f.mode)}, {"section_start", f.section_start}, {"section_end", f.section_end},
                   {"per_call_start", f.per_call_start}, {"per_call_end", f.per_call_end},
                   {"fun_name_is_key", f.fun_name_is_key}, {"tools_array_wrapped", f.tools_array_wrapped},
                   {"openai_wrapper_trigger", f.openai_wrapper_trigger}, {"function_field", f.function_field},
                   {"name_field", f.name_field}, {"args_field", f.args_field}, {"id_field", f.id_field},
                   {"gen_id_field", f.gen_id_field}, {"parameter_order", f.parameter_order},
                   {"name_prefix", fn.name_prefix}, {"name_suffix", fn.name_suffix},
                   {"args_separator", fn.args_separator}, {"close", fn.close},
                   {"args_start", args.start}, {"args_end", args.end},
                   {"arg_name_prefix", args.name_prefix}, {"arg_name_suffix", args.name_suffix},
                   {"arg_value_prefix", args.value_prefix}, {"arg_value_suffix", args.value_suffix},
                   {"arg_separator", args.separator},
                   {"tolerate_intertag_whitespace", args.tolerate_intertag_whitespace},
                   {"call_id_pos", name_of(a.tools.call_id.pos)}, {"call_id_prefix", a.tools.call_id.prefix},
                   {"call_id_suffix", a.tools.call_id.suffix}}},
        {"user_start", a.user_start}, {"assistant_start", a.assistant_start},
        {"preserved_tokens", a.preserved_tokens},
    };
}

int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        ojson out;
        try {
            auto job = ojson::parse(line);
            std::ifstream f(job.at("template").get<std::string>());
            std::stringstream ss; ss << f.rdbuf();
            if (job.value("analysis", false)) {
                std::cout << ojson{{"analysis", analysis_json(ss.str())}}.dump() << std::endl;
                continue;
            }
            auto tmpls = common_chat_templates_init(nullptr, ss.str(), "<s>", "</s>");
            if (job.value("caps", false)) {  // /props chat_template_caps
                ojson caps = ojson::object();
                for (auto & [name, value] : common_chat_templates_get_caps(tmpls.get())) caps[name] = value;
                std::cout << ojson{{"caps", caps}}.dump() << std::endl;
                continue;
            }
            common_chat_templates_inputs inputs;
            inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(job.at("messages").dump()));
            if (job.contains("tools") && !job["tools"].empty()) inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(job["tools"].dump()));
            if (job.contains("tool_choice")) inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(job["tool_choice"].get<std::string>());
            inputs.parallel_tool_calls = job.value("parallel_tool_calls", false);
            inputs.reasoning_format = common_reasoning_format_from_name(job.value("reasoning_format", std::string("none")));
            inputs.enable_thinking = job.value("enable_thinking", true);
            auto params = common_chat_templates_apply(tmpls.get(), inputs);
            common_chat_parser_params pp(params);
            pp.reasoning_format = inputs.reasoning_format;
            pp.parser.load(params.parser);
            out["format"] = common_chat_format_name(params.format);
            out["grammar_lazy"] = params.grammar_lazy;
            out["has_grammar"] = !params.grammar.empty();
            ojson triggers = ojson::array();
            for (auto & t : params.grammar_triggers) triggers.push_back({{"type", (int) t.type}, {"value", t.value}});
            out["grammar_triggers"] = triggers;
            out["preserved_tokens"] = params.preserved_tokens;
            auto input = job.at("input").get<std::string>();
            try { out["whole"] = msg_json(common_chat_parse(input, false, pp)); }
            catch (const std::exception & e) { out["whole_error"] = e.what(); }
            try { out["partial"] = msg_json(common_chat_parse(input, true, pp)); }
            catch (const std::exception & e) { out["partial_error"] = e.what(); }
        } catch (const std::exception & e) {
            out["error"] = e.what();
        }
        std::cout << out.dump() << std::endl;
    }
}
