"""The page in English and Chinese: a switch at the top of the page, remembered in the browser (localStorage, through
gr.BrowserState), changes every label, help text, button, heading and status message.

Texts are written in English where the component is made; `ZH` gives the Chinese of each, keyed by that English
(the settings' own Chinese labels and help texts come from roctune.config, declared beside the English ones). A
handler learns the session's language from a gr.State input (`Lang`), which is not part of the HTTP API, and
`t()` translates its messages while it runs. The CLI's error lines stay as the CLI prints them (the library speaks
English), with a Chinese lead-in on a Chinese page.

Why not gr.I18n: Gradio translates those keys in the browser by the browser's locale and only for the labels it
renders itself; it cannot be switched and remembered from the page, and the status boxes and tables the handlers
return (HTML made on the server) would stay English.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager

LANGS = {"English": "en", "中文": "zh"}
STORAGE_KEY = "roctune-language"


def from_accept_language(header: str) -> str:
    """The page's language for a browser's Accept-Language header (`zh-CN,zh;q=0.9,en;q=0.8`): the first of
    its languages the page speaks, by preference weight; English when none."""
    ranked = []
    for i, part in enumerate((header or "").split(",")):
        tag, _, params = part.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                q = 0.0
        ranked.append((-q, i, tag.strip().lower().split("-")[0]))
    for _, _, code in sorted(ranked):
        if code in LANGS.values():
            return code
    return "en"


def check_lang(code: str | None) -> None:
    """`roctune webui --lang CODE`: one of the page's languages (None: not given)."""
    from roctune.errors import ConfigError

    if code is not None and code not in LANGS.values():
        raise ConfigError(f"--lang {code!r}: the page speaks {' or '.join(LANGS.values())}; choose one of them")


class Lang(str):
    """The language of a session as a handler input: a str that says it is one, so `guard` can tell it from the
    text inputs before it."""


_current: contextvars.ContextVar[str] = contextvars.ContextVar("roctune_webui_lang", default="en")


def current() -> str:
    return _current.get()


@contextmanager
def language(lang: str | None):
    """Handlers run their body inside this: `t()` then speaks `lang`."""
    token = _current.set("zh" if lang == "zh" else "en")
    try:
        yield
    finally:
        _current.reset(token)


def t(text: str, **kw) -> str:
    """`text` (English, with {placeholders}) in the current language, filled in with `kw`."""
    out = catalog().get(text, text) if current() == "zh" else text
    return out.format(**kw) if kw else out


def tr(text: str, lang: str) -> str:
    with language(lang):
        return t(text)


_CATALOG: dict[str, str] = {}


def catalog() -> dict[str, str]:
    """English -> Chinese: the page's texts and every setting's label, help and group title."""
    if not _CATALOG:
        from roctune import config

        _CATALOG.update(ZH)
        for s in config.form_fields():
            _CATALOG.setdefault(s["name"].replace("_", " "), s["label_zh"])
            _CATALOG.setdefault(s["help"], s["help_zh"])
        for group, title in config.GROUP_TITLES.items():
            _CATALOG.setdefault(title, config.GROUP_TITLES_ZH[group])
    return _CATALOG


# ------------------------------------------------------------------------------------- the page's components
TEXT_PROPS = ("label", "info", "placeholder")
VALUE_KINDS = ("Button", "Markdown")  # their value is their text


def texts_of(block) -> dict[str, str]:
    """The English texts of a component as made ({prop: text}); a Markdown with values in it carries its
    template in `_rt_template` (text, kwargs)."""
    out = {p: getattr(block, p) for p in TEXT_PROPS if isinstance(getattr(block, p, None), str)
           and getattr(block, p)}
    if type(block).__name__ in VALUE_KINDS and isinstance(getattr(block, "value", None), str):
        out["value"] = block.value
    if type(block).__name__ == "LinePlot":
        out.update({p: getattr(block, p) for p in ("title", "x_title", "y_title")
                    if isinstance(getattr(block, p, None), str) and getattr(block, p)})
    return out


def choice_labels(make, labels: dict[str, str], **kw):
    """A choice component (`make`: gr.CheckboxGroup, gr.Radio, gr.Dropdown) whose choices show `labels`
    ({value: English label}) in the page's language; the values a handler gets stay as they are."""
    block = make([(label, value) for value, label in labels.items()], **kw)
    block._rt_choices = labels
    return block


def translatable(app) -> list:
    """[(component, {prop: English})] of every component of `app` with a text to translate."""
    out = []
    for block in app.blocks.values():
        texts = texts_of(block)
        if texts or getattr(block, "_rt_choices", None):
            out.append((block, texts))
    return out


def updates(gr, items: list, lang: str) -> list:
    """One gr.update per component of `translatable`, with its texts (and labelled choices) in `lang`."""
    out = []
    with language(lang):
        for block, texts in items:
            template = getattr(block, "_rt_template", None)
            new = {p: t(v) for p, v in texts.items()}
            if template:
                new["value"] = t(template[0], **template[1])
            labels = getattr(block, "_rt_choices", None)
            if labels:
                new["choices"] = [(t(label), value) for value, label in labels.items()]
            out.append(gr.update(**new))
    return out


def missing(app) -> list[str]:
    """English texts of the page with no Chinese (empty when the page is fully translated)."""
    have = catalog()
    out = []
    for block, texts in translatable(app):
        template = getattr(block, "_rt_template", None)
        keys = [template[0] if template and prop == "value" else text for prop, text in texts.items()]
        for key in keys + list((getattr(block, "_rt_choices", None) or {}).values()):
            if key not in have and key not in SAME:
                out.append(key)
    return sorted(set(out))


# Texts that read the same in both languages (names of things).
SAME = {"LoRA alpha", "LoRA dropout", "↻"}

ZH: dict[str, str] = {
    # the page
    "## roctune: LoRA fine-tuning on AMD (ROCm), NVIDIA (CUDA) and the CPU":
        "## roctune：在 AMD（ROCm）、NVIDIA（CUDA）和 CPU 上做 LoRA 微调",
    "workspace: `{root}` (the page reads and writes only inside it)": "工作区：`{root}`（页面只在其中读写）",
    "language": "语言",
    "Doctor": "环境检查", "Data": "数据", "Train": "训练", "Runs": "运行记录", "Chat": "对话", "Eval": "评估",
    "Export": "导出",
    # doctor
    "What this machine can do for training (`roctune doctor`), with the fix for each problem.":
        "这台机器能做什么样的训练（`roctune doctor`），每个问题都附带修复方法。",
    "Run the checks again": "重新检查",
    "checking...": "检查中……",
    "check": "检查项", "level": "级别", "finding (why, fix)": "结果（原因、修复）", "fix:": "修复：",
    "torch {version} ({backend}); GPUs: {gpus}; verdict:": "torch {version}（{backend}）；GPU：{gpus}；结论：",
    "none found": "未找到",
    # data
    "dataset path(s), one per line": "数据集路径，每行一个",
    "dataset (pick from the workspace or type a path)": "数据集（从工作区中选择，或输入路径）",
    "data/train.jsonl (.jsonl, .json, .csv, .tsv, .parquet)": "data/train.jsonl（.jsonl、.json、.csv、.tsv、.parquet）",
    "or upload a file": "或上传文件",
    "Preview": "预览", "Run checks": "运行检查", "records": "记录",
    "token lengths vs max length (0: skip)": "与最大长度比较 token 长度（0：跳过）",
    "record number (from 0)": "记录编号（从 0 开始）",
    "Show what training learns from it": "显示训练从中学习的内容",
    "PII scrub (phone numbers, ID and bank cards, e-mails, IPs)": "隐私脱敏（手机号、身份证和银行卡号、邮箱、IP）",
    "types (none ticked: all)": "类型（都不勾选：全部）",
    "write the scrubbed copy to": "脱敏副本写到",
    "default: <input>.scrubbed.<ext>": "默认：<输入>.scrubbed.<扩展名>",
    "Scrub": "脱敏", "Use this dataset in the Train panel": "在训练页使用此数据集",
    "e-mail addresses": "邮箱地址", "ID card numbers (China)": "身份证号", "bank card numbers": "银行卡号",
    "mobile phone numbers": "手机号", "landline phone numbers": "固定电话号码", "IPv4 addresses": "IPv4 地址",
    "Refresh the lists": "刷新列表", "↻": "↻",
    "uploaded into the workspace: {path}": "已上传到工作区：{path}",
    "first {n} record(s) of {paths}": "{paths} 的前 {n} 条记录",
    "learned text highlighted, context dimmed": "高亮的是训练学习的文本，灰色的是上下文",
    "checked": "检查完成",
    "scrubbed copy written to {path}": "脱敏副本已写到 {path}",
    "no dataset: pick a file, upload one or type its path": "没有数据集：请选择、上传或输入一个文件路径",
    "scrub takes one input file; pick exactly one dataset": "脱敏只接受一个输入文件；请只选择一个数据集",
    "{tokens} tokens, {learned} learned": "{tokens} 个 token，其中 {learned} 个参与学习",
    "learned": "学习", "context": "上下文",
    "where": "位置", "prompt": "提示", "answer": "回答",
    # train
    "Start training": "开始训练", "Stop": "停止", "training loss": "训练损失",
    "run directory when done": "完成后的运行目录", "log": "日志",
    "Preview command": "预览命令", "Save settings": "保存设置", "Load settings": "加载设置",
    "settings name (saved as settings/NAME.yaml in the workspace)": "设置名称（保存为工作区中的 settings/NAME.yaml）",
    "the command and settings file for this form": "此表单对应的命令和设置文件",
    "off: start the server with `roctune webui --trust-remote-code` to allow a model's own code":
        "关闭：用 `roctune webui --trust-remote-code` 启动服务才允许运行模型自带的代码",
    "a training run is already going; stop it first": "已有训练在进行；请先停止它",
    "started: {command}": "已开始：{command}",
    "starting...": "启动中……",
    "starting: loading the model and tokenizing the data...": "启动中：正在加载模型并分词……",
    "done: adapter saved to {path}": "完成：适配器已保存到 {path}",
    "stopped at step {step}; the unfinished run is in {path}": "已在第 {step} 步停止；未完成的运行在 {path}",
    "no training run is going": "没有正在进行的训练",
    "stopping...": "正在停止……",
    "running: {phase}": "运行中：{phase}",
    "starting": "启动中", "tokenizing the data": "正在分词", "loading the model": "正在加载模型",
    "training": "训练中", "evaluating": "评估中", "saving the final model": "正在保存最终模型",
    "done": "完成", "failed": "失败", "stopped": "已停止", "running": "运行中",
    "step {step}/{total}": "第 {step}/{total} 步", "step": "步", "loss": "损失", "loss {loss}": "损失 {loss}", "eval loss {loss}": "评估损失 {loss}",
    "{n} tokens/s": "{n} token/秒", "ETA {eta}": "剩余 {eta}",
    "settings saved to {path}": "设置已保存到 {path}",
    "settings file {name}: a settings name is letters, digits, _ and - (saved as {folder}/NAME{suffix} in the "
    "workspace); choose another name": "设置文件 {name}：设置名称只能由字母、数字、_ 和 - 组成（保存为工作区中的 "
    "{folder}/NAME{suffix}）；请换一个名称",
    "settings loaded from {path}": "已从 {path} 加载设置",
    "unset": "未设置",
    "estimated peak memory: <b>{total}</b> on {device} ({dtype}, batch {batch} x {length} tokens, {trained} of "
    "{params} parameters trained).":
        "估计峰值内存：<b>{total}</b>，设备 {device}（{dtype}，批大小 {batch} × {length} 个 token，训练 {params} 个参数中"
        "的 {trained} 个）。",
    "fits {where} ({avail})": "在 {where} 内（{avail}）放得下",
    "does not fit {where} ({avail}): lower the max length or batch size (`roctune estimate --suggest`)":
        "超出 {where}（{avail}）：请降低最大长度或批大小（`roctune estimate --suggest`）",
    "breakdown": "明细", "system RAM": "系统内存", "the GPU": "GPU",
    # runs
    "Every run in the workspace, newest first.": "工作区中的所有运行，最新的在前。",
    "run": "运行", "status": "状态", "steps": "步数", "last loss": "最后损失", "eval loss": "评估损失",
    "method": "方法", "model": "模型", "updated": "更新时间",
    "compare two runs": "比较两次运行", "first run": "第一个运行", "second run": "第二个运行",
    "runs": "运行", "checkpoint": "检查点",
    "{n} run(s) in {root}": "{root} 中有 {n} 个运行",
    "loss of {run}": "{run} 的损失",
    # chat
    "adapter (a run directory; empty: the base model alone)": "适配器（运行目录；留空：只用基础模型）",
    "base model (default: the one the adapter was trained on)": "基础模型（默认：适配器训练时所用的模型）",
    "side by side: base vs fine-tuned": "并排对比：基础模型与微调后",
    "max new tokens": "最大新 token 数", "temperature (0: greedy)": "温度（0：贪心）",
    "base model": "基础模型", "fine-tuned": "微调后",
    "type a message and press Enter": "输入消息后按回车",
    "Send": "发送", "Clear": "清空",
    "type a message first": "请先输入消息", "picture (a vision-language model)": "图片（视觉语言模型）", "answering...": "正在回答……", "top-p": "核采样阈值",
    "system prompt (empty: the chat template's own)": "系统提示词（留空：对话模板自带的）",
    "{who}: answered in {s}s": "{who}：用时 {s} 秒回答",
    # eval
    "Is the fine-tune better than its base model on held-out data? Loss and perplexity (as training computes "
    "them), BLEU-4, ROUGE and exact match of greedy answers (`roctune eval`).":
        "在留出数据上，微调后的模型是否比基础模型更好？损失和困惑度（与训练的算法相同）、贪心回答的 BLEU-4、ROUGE "
        "和完全匹配（`roctune eval`）。",
    "adapter (run directory)": "适配器（运行目录）",
    "held-out data (one path per line)": "留出数据（每行一个路径）",
    "report folder (default: RUN/eval)": "报告目录（默认：运行目录/eval）",
    "Evaluate": "评估", "Show the last report": "显示上次的报告",
    "report from {path}": "来自 {path} 的报告",
    # export
    "Merge the adapter into its base model and save a plain transformers model (`roctune merge`).":
        "把适配器合并进基础模型，保存为普通的 transformers 模型（`roctune merge`）。",
    "save the merged model to": "合并后的模型保存到", "overwrite": "覆盖",
    "Merge and save": "合并并保存",
    "Export a GGUF file for llama.cpp and Ollama, with a Modelfile and DEPLOY.md, run in llama.cpp "
    "(or read back) and compared with the merged model (`roctune export`); lora-gguf: the adapter "
    "alone, for `llama-server --lora` and Ollama's ADAPTER beside a GGUF of the base model.":
        "导出供 llama.cpp 和 Ollama 使用的 GGUF 文件，附带 Modelfile 和 DEPLOY.md，在 llama.cpp 中运行（或读回）"
        "并与合并后的模型比较（`roctune export`）；lora-gguf：只导出适配器，配合基础模型的 GGUF 用于 "
        "`llama-server --lora` 和 Ollama 的 ADAPTER。",
    "format": "格式",
    "merged model answers": "合并后模型的回答", "GGUF answers": "GGUF 的回答", "equal": "相同", "yes": "是", "no": "否",
    "export folder": "导出目录", "name (Ollama)": "名称（Ollama）", "check after writing": "写完后检查",
    "Export GGUF": "导出 GGUF",
    # errors
    "error: {line}": "出错：{line}",
    "no adapter: give a run directory (the Train panel fills it in)": "没有适配器：请给出一个运行目录（训练页会自动填入）",
    "no held-out data: give a dataset file with reference answers": "没有留出数据：请给出带参考答案的数据文件",
    "give the run directory (or the report folder) to show": "请给出要显示的运行目录（或报告目录）",
    "no output directory: give where to save the {what}": "没有输出目录：请给出{what}保存的位置",
    "merged model": "合并后的模型", "GGUF export": "GGUF 导出",
    "{what} {path}: outside the workspace {root}; the web UI reads and writes only inside it (start it with roctune "
    "webui --root DIR to choose another)":
        "{what} {path}：在工作区 {root} 之外；网页界面只在工作区内读写（用 roctune webui --root DIR 启动可换一个工作区）",
    "the upload did not arrive; try again": "上传没有成功；请重试",
    # data check report (rendered from check_data's result)
    "empty fields": "空字段", "duplicates": "完全重复", "near duplicates": "近似重复", "conflicts": "答案冲突",
    "answer equals prompt": "回答与提示相同", "eval overlap": "与评估数据重叠",
    "records with an empty or whitespace-only turn": "有空白轮次的记录",
    "exact repeats of an earlier record": "与前面某条记录完全相同",
    "repeats after ignoring case, punctuation and spacing": "忽略大小写、标点和空白后重复",
    "prompts that have different answers": "同一提示有不同回答",
    "answers identical to their prompt": "回答与其提示完全相同",
    "training records also in the eval data": "同时出现在评估数据中的训练记录",
    "tokens per example: p50 {p50}, p95 {p95}, max {max}, mean {mean}":
        "每条样本的 token 数：中位数 {p50}，95 分位 {p95}，最大 {max}，平均 {mean}",
    "max length {n} truncates {k} example(s)": "最大长度 {n} 会截断 {k} 条样本",
    "<b>{n}</b> records read from {paths}: {valid} valid, {bad} with schema errors":
        "从 {paths} 读取 <b>{n}</b> 条记录：{valid} 条有效，{bad} 条格式错误",
    "Schema errors (training refuses this data until they are fixed):": "格式错误（修复之前训练会拒绝这份数据）：",
    "count": "数量", "first examples": "前几个例子",
    "{a} repeats {b}": "{a} 与 {b} 重复", "{n} different answers: {where}": "{n} 种不同回答：{where}",
    " and {k} more": " 等（另有 {k} 条）", "{where}: {role} turn {i} is empty": "{where}：第 {i} 轮（{role}）为空",
    "schema errors: training refuses this data": "有格式错误：训练会拒绝这份数据", "no schema errors": "没有格式错误",
    "type": "类型", "placeholder": "占位符",
    "Redacted in {n} records ({changed} changed); wrote {path}": "已处理 {n} 条记录（{changed} 条有改动）；写入 {path}",
    # errors in the page's words (html.PAGE_ERRORS), with the form's field names
    "{field}: must be {op} {limit} (got {got})": "{field}：必须 {op} {limit}（当前为 {got}）",
    "{field}: must be one of {choices} (got {got})": "{field}：必须是 {choices} 之一（当前为 {got}）",
    "{field}: must be a finite number (got {got})": "{field}：必须是有限的数（当前为 {got}）",
    "{field}: expected a number (got {got})": "{field}：应为数字（当前为 {got}）",
    "{field}: expected a whole number (got {got})": "{field}：应为整数（当前为 {got}）",
    "{field}: {got} is not a name (letters, digits and _ . - only, e.g. q_proj)":
        "{field}：{got} 不是名称（只能由字母、数字和 _ . - 组成，例如 q_proj）",
    "{field}: {got} holds a control character (a line break, a tab or NUL); remove it":
        "{field}：{got} 含有控制字符（换行、制表符或 NUL）；请删除它",
    "{field}: no training data; pick or upload a dataset": "{field}：没有训练数据；请选择或上传一个数据集",
    "{field}: no output folder; give one": "{field}：没有输出目录；请填写一个",
    "{field}: set the epochs or the max steps above 0": "{field}：请把训练轮数或最大步数设为大于 0",
    "{field} replaces a run and {resume} continues it; tick only one of them":
        "“{field}”会替换已有运行，“{resume}”会继续它；只能勾选其中一个",
    "{field} {path} already holds a previous run; tick {resume} to continue it or {overwrite} to replace it, or "
    "choose another folder": "{field} {path} 中已有一次运行；勾选“{resume}”继续它，或勾选“{overwrite}”替换它，或换一个目录",
    "{field}: {path} holds no run to continue; untick it to start a new run":
        "{field}：{path} 中没有可继续的运行；取消勾选即可开始新的运行",
    "{field} {path}: no such folder": "{field} {path}：目录不存在",
    "{field} {name}: not found; pick one from the list, or give a model folder in the workspace or a hub id "
    "(org/name)": "{field} {name}：找不到；请从列表中选择，或填写工作区中的模型目录或 Hub 上的模型 ID（组织/名称）",
    # train
    "One training at a time per server: Start is refused while a run trains (stop it first).":
        "每个服务同一时间只能进行一个训练：训练进行时会拒绝再次开始（请先停止）。",
    "Dismiss": "关闭提示",
    "a training run is already going ({path}); one training at a time per server: stop it first":
        "已有训练在进行（{path}）；每个服务同一时间只能进行一个训练：请先停止它",
    "last run of the workspace: {path} ({state})": "工作区中最近的运行：{path}（{state}）",
    "weights": "权重", "trainable parameters": "可训练参数", "half-precision copies of trained weights":
        "训练权重的半精度副本", "gradients": "梯度", "optimizer states": "优化器状态", "activations": "激活值",
    "logits and loss": "logits 与损失", "optimizer step workspace": "优化器步骤的工作内存",
    "minus: not alive at the same time": "减去：不同时存在的部分", "framework / allocator overhead": "框架与分配器开销",
    # eval report (rendered from the eval result)
    "{n} records from {data}; greedy answers of at most {tokens} tokens; scores 0-100":
        "{data} 中的 {n} 条记录；贪心回答，最多 {tokens} 个 token；分数为 0-100",
    "{metric} ({better})": "{metric}（{better}）", "lower is better": "越低越好", "higher is better": "越高越好", "perplexity": "困惑度",
    "exact match %": "完全匹配 %", "metric": "指标", "change": "变化", "#": "#", "reference": "参考答案",
    "base answer": "基础模型的回答", "tuned answer": "微调后的回答", "Examples, most improved first": "样例（提升最多的在前）",
    "evaluated {n} record(s); report written to {path}": "已评估 {n} 条记录；报告已写到 {path}",
    # export
    "merged model saved to {path}": "合并后的模型已保存到 {path}", "exported to {path}": "已导出到 {path}",
    "fidelity check ({quant}): mean KL divergence {kl} (limit {limit}), same top token at {top}% of {n} positions, "
    "greedy answers equal {equal}/{total}":
        "保真度检查（{quant}）：平均 KL 散度 {kl}（上限 {limit}），{n} 个位置中 {top}% 的最高概率 token 相同，"
        "贪心回答相同 {equal}/{total}",
    "quant": "量化类型", "dtype": "数据类型",
    # doctor
    "PyTorch build": "PyTorch 版本与后端", "WSL": "WSL 环境", "access to the AMD GPU": "AMD GPU 访问权限",
    "QLoRA (4-bit)": "QLoRA（4 位量化）", "FlashAttention": "FlashAttention 加速", "training precision": "训练精度",
    "AMD kernel driver (/dev/kfd)": "AMD 内核驱动（/dev/kfd）", "GPU in PyTorch": "PyTorch 能否使用 GPU",
    "package versions": "依赖包版本", "NVIDIA driver": "NVIDIA 驱动", "several GPUs: IOMMU": "多 GPU：IOMMU",
    "several GPUs": "多 GPU", "visible GPUs": "可见的 GPU", "several GPUs: peer to peer": "多 GPU：点对点通信",
    "several GPUs: mixed models": "多 GPU：型号混用", "training on the CPU": "在 CPU 上训练",
    "attention kernel": "注意力实现", "ROCm version": "ROCm 版本", "AMD render device (/dev/dri)": "AMD 渲染设备（/dev/dri）",
    "GPU architecture": "GPU 架构", "GPU memory": "GPU 显存",
    "GPU architecture: HSA_OVERRIDE_GFX_VERSION": "GPU 架构：HSA_OVERRIDE_GFX_VERSION",
    "system": "系统", "user": "用户", "assistant": "助手",
    "OK": "正常", "WARN": "警告", "FAIL": "失败",
}
